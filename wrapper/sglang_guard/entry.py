"""The one wiring of a guarded run, for `sglang-guard run`, the drop-in and `serve`.

`sglang-guard run` (cli.py), the drop-in `sglang-guard-launch` (launch_server.py) and
`sglang-guard serve` (serve.py) differ only in where their settings come from; each hands
them to `run_process`. Here too is `guarded`, the only place that turns errors into exit
statuses, and what the drop-in and `serve` read from the environment. This module imports
none of those three: no import circle.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NoReturn, TypeVar

import click

from sglang_guard.checkcmd import exit_for
from sglang_guard.config.guardconfig import GuardConfig, with_overrides
from sglang_guard.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])
LOG_FORMATS = ("auto", "json", "console")

GUARD_LINE = ("\n[sglang-guard] This server runs under sglang-guard: backend flags are checked "
              "against the model and GPU before launch, and fatal log lines are fixed and "
              "restarted. Settings: SGLANG_GUARD_* environment variables or "
              "/etc/sglang-guard/guard.toml.\n")


def guarded(fn: F) -> F:
    """Run a command body: a GuardError becomes one line on stderr and its exit status."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except click.ClickException:
            raise  # click prints usage errors itself (exit 2)
        except (Exception, KeyboardInterrupt) as exc:  # a bug: one line unless debugging
            exit_for(exc, click.echo)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper  # type: ignore[return-value]


def run_process(cfg: GuardConfig, argv: Sequence[str], *, python: str | None,
                state_dir: str | None = None, preflight: bool = True,
                log_format: str | None = None, argv_from_config: bool = False,
                overrides: Callable[[GuardConfig], GuardConfig] | None = None) -> NoReturn:
    """Supervise SGLang with `argv` under `cfg` (status port, state-dir lock, early signals),
    then exit the process with the run's status."""
    from sglang_guard.common.shell import logsetup  # noqa: PLC0415 - the run path only
    from sglang_guard.common.shell.heap import share_one_arena  # noqa: PLC0415
    from sglang_guard.supervise.shell.runner import RunOptions  # noqa: PLC0415
    from sglang_guard.supervise.shell.session import (  # noqa: PLC0415
        exit_process,
        run_guarded,
        run_with_status,
    )
    from sglang_guard.supervise.shell.statelock import default_run_state_dir  # noqa: PLC0415

    share_one_arena()  # before any thread of the run: its chunks' memory goes back after a flood
    logsetup.configure(log_format or cfg.log_format)
    args = tuple(argv)
    opts = RunOptions(argv=args, python=python,
                      state_dir=state_dir or cfg.state_dir or default_run_state_dir(args),
                      preflight=preflight, argv_from_config=argv_from_config)
    if overrides is not None:
        opts = replace(opts, overrides=overrides)
    exit_process(run_guarded(cfg, opts, run_with_status))


# -- the drop-in's and `serve`'s settings: the environment and the default config files -----


def guard_config_from_env() -> GuardConfig:
    """The guard config: the file (env or default places), then SGLANG_GUARD_* overrides."""
    from sglang_guard.config.shell.configfile import locate, read_guard_config  # noqa: PLC0415

    cfg = read_guard_config(locate(None, search_defaults=True))
    cfg = with_overrides(cfg, os.environ.get("SGLANG_GUARD_POLICY"),
                         os.environ.get("SGLANG_GUARD_GPU_SM"),
                         policy_source="SGLANG_GUARD_POLICY")
    if os.environ.get("SGLANG_GUARD_STATE_DIR"):
        cfg = replace(cfg, state_dir=os.environ["SGLANG_GUARD_STATE_DIR"])
    fmt = os.environ.get("SGLANG_GUARD_LOG_FORMAT")
    if fmt:  # a typo is said, as for SGLANG_GUARD_POLICY, not silently ignored
        if fmt not in LOG_FORMATS:
            raise InputError(f"SGLANG_GUARD_LOG_FORMAT={fmt!r}: expected one of "
                             f"{', '.join(LOG_FORMATS)}")
        cfg = replace(cfg, log_format=fmt)  # type: ignore[arg-type]
    return cfg


def python() -> str:
    """The interpreter that has SGLang ($SGLANG_GUARD_PYTHON, else the guard's own)."""
    return os.environ.get("SGLANG_GUARD_PYTHON") or sys.executable


def preflight_from_env() -> bool:
    """Whether preflight runs (SGLANG_GUARD_PREFLIGHT=0 turns it off)."""
    return os.environ.get("SGLANG_GUARD_PREFLIGHT", "1") != "0"


def print_sglang_help(command: Sequence[str], usage: str, timeout: float) -> int:
    """SGLang's own help (`command`, when SGLang is installed), plus one paragraph about the
    guard; `usage` stands in when SGLang cannot print it."""
    import subprocess  # noqa: PLC0415 - only for --help

    try:
        out = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout,
                             check=False)
        text = out.stdout if out.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    if not text:
        text = (f"usage: {usage}\n\n"
                f"SGLang is not installed for {python()}: its help cannot be shown.\n")
    sys.stdout.write(text + GUARD_LINE)
    return 0
