"""`sglang-guard serve ARGS…`: exactly what `sglang serve ARGS…` takes, launched that way.

SGLang 0.5.23's `sglang serve` (sglang/cli/serve.py) takes the model path as its first
positional argument or as `--model-path`, picks a backend with `--model-type` (default
auto), and hands the rest to launch_server's parser; older releases read less
(sglang/launcher.ServeReading). The guard reads the argv as the release that runs does: the
positional model becomes `--model-path` for preflight, `--model-type` stays with the launch
command, and the child is `sglang serve …`; a line that release's serve.py fails before it
parses is refused (exit 2) with SGLang's own words, not launched. Guard settings come from
the environment and config files, as for the drop-in launcher; the run itself is entry.py's.

A line SGLang would not serve with the LLM server (a diffusion pipeline:
sglang/shell/servebackend.py) is handed to `sglang serve` as written, unguarded
(`hand_over`), with one line that says why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from sglang_guard.config.guardconfig import GuardConfig
from sglang_guard.entry import (
    guard_config_from_env,
    guarded,
    preflight_from_env,
    print_sglang_help,
    python,
    run_process,
)
from sglang_guard.errors import GuardError, InputError
from sglang_guard.sglang.launcher import ServeReading, serve_error, serve_reading, split_args
from sglang_guard.sglang.shell.servebackend import backend


def sglang_command(py: str) -> list[str]:
    """The `sglang` console script of `py`'s environment (beside it), else one on PATH."""
    beside = Path(py).with_name("sglang")
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("sglang")
    if found:
        return [found]
    # No script installed: the same entry point, through the interpreter.
    return [py, "-c", "import sys; from sglang.cli.main import main; sys.exit(main())"]


def show_help(args: Sequence[str]) -> int:
    """`sglang serve --help` as SGLang prints it, plus one paragraph about the guard."""
    own, _ = split_args([a for a in args if a not in ("-h", "--help")])
    return print_sglang_help([*sglang_command(python()), "serve", *own, "--help"],
                             "sglang-guard serve [sglang serve arguments]", 300)


def main(args: Sequence[str]) -> None:
    """`sglang-guard serve ARGS…`."""
    if "-h" in args or "--help" in args:
        sys.exit(show_help(args))
    _serve(list(args))


def hand_over(serve: Sequence[str], args: Sequence[str], reading: ServeReading | None = None
              ) -> None:
    """Exec `serve` (a `sglang serve` command) with `args` as written when SGLang would not
    serve them with the LLM server (`backend`), saying why in one line; else return.
    `reading`: how the release that runs reads them (None: the newest)."""
    why = backend(*split_args(args, reading), reading)
    if why is None:
        return
    sys.stderr.write(f"sglang-guard: {why}, which the guard does not check or supervise: "
                     "running `sglang serve` unguarded\n")
    sys.stderr.flush()
    _tell_systemd(why)
    command = [*serve, *args]
    from sglang_guard.supervise.shell.supervisor import GUARD_ONLY_ENV  # noqa: PLC0415

    # As for a guarded child: systemd's variables are the guard's own
    env = {k: v for k, v in os.environ.items() if k not in GUARD_ONLY_ENV}
    try:
        os.execvpe(command[0], command, env)  # noqa: S606 - an argv, no shell, as SGLang's
    except OSError as exc:
        raise InputError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from exc


def _tell_systemd(why: str) -> None:
    """Under a Type=notify unit (the shipped ones: systemd/), the exec'd `sglang serve` keeps
    the guard's pid but sends no READY=1 nor WATCHDOG=1: say the start is done, with why in
    STATUS=, and turn the unit's watchdog off (WATCHDOG_USEC=0: systemd's service.c
    `service_start_watchdog` stops it for a zero override), or systemd would kill a serving
    process after TimeoutStartSec= or WatchdogSec=."""
    from sglang_guard.supervise.shell.notify import Notifier  # noqa: PLC0415

    notifier = Notifier()
    if notifier.enabled:
        notifier.send("READY=1", f"STATUS=sglang serve runs unguarded: {why}"[:500],
                      "WATCHDOG_USEC=0")
        notifier.close()


def reading_for(version: str | None, py: str | None) -> ServeReading:
    """How the `sglang serve` that runs reads its words: the release `version` names ([sglang]
    version), else the one `py`'s environment holds, else the newest."""
    if not version and py:
        from sglang_guard.sglang.shell.release import (  # noqa: PLC0415
            find_release,
            interpreter_path,
        )

        with contextlib.suppress(GuardError):  # unreadable: the run says so itself
            fact = find_release(interpreter_path(py))
            version = fact.version if fact is not None else None
    return serve_reading(version)


def refuse_unservable(cfg: GuardConfig, args: Sequence[str], py: str | None
                      ) -> ServeReading:
    """How the release that runs reads `sglang serve ARGS` (`reading_for`); InputError (exit
    2, never launched) with SGLang's own words where its serve fails before parsing."""
    reading = reading_for(cfg.sglang.version, py)
    failed = serve_error(args, reading)
    if failed is not None:
        raise InputError(failed)
    return reading


@guarded
def _serve(args: list[str]) -> None:
    cfg = guard_config_from_env()
    py = os.environ.get("SGLANG_GUARD_PYTHON") or cfg.sglang.python or sys.executable
    reading = refuse_unservable(cfg, args, py)
    own, server_args = split_args(args, reading)
    serve = cfg.sglang.launch or (*sglang_command(py), "serve")
    hand_over(serve, args, reading)
    launch = (*serve, *own)
    cfg = replace(cfg, sglang=replace(cfg.sglang, launch=launch, python=py))
    run_process(cfg, server_args, python=py, preflight=preflight_from_env())
