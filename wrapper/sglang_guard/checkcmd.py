"""`sglang-guard check`'s body, and its plain command lines read without click.

click's import is ~10 ms of a cached `check`'s ~100 (issue 24: cached <= 0.1 s). `cli.check`
(click) and `run_plain` run the same `run_check`. `plain_check_args` reads only the shape

    check [--policy P | --gpu-sm S | --config F | --state-dir D | --sglang-version V
           | --python PY | --json]... -- SGLANG-ARG...

each option at most once, its value a separate word that does not start with `-`, `--policy`
one of POLICY_MODES, at least one word after `--`: what click reads from such a line is
plain (tests/unit/test_check_plainargs.py holds the two readings equal over every command
line of up to five words from an alphabet of options, values and odd words). Any other line
(help, `--opt=value`, an option click would take as an SGLang argument, a value click would
reject, no `--`, shell completion, a console click would re-wrap) is None here and goes to
click, which parses it and words its own errors. Output goes through `echo`, which writes
what click.echo writes.

Importing this module costs nothing a `check` would not pay: it imports no click and no table.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from sglang_guard.errors import (
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_REMEDIATED,
    EXIT_USAGE,
    GuardError,
    InputError,
)

if TYPE_CHECKING:
    from sglang_guard.config.guardconfig import GuardConfig
    from sglang_guard.sglang.launcher import Launch, ServeReading

VERDICT_EXIT = {"ok": EXIT_OK, "remediated": EXIT_REMEDIATED, "refused": EXIT_REFUSED,
                "rejected": EXIT_USAGE}
# check's options that take a value (spelling -> parameter), and its one flag
VALUE_OPTIONS = {"--policy": "policy", "--gpu-sm": "gpu_sm", "--config": "config_path",
                 "--state-dir": "state_dir", "--sglang-version": "sglang_version",
                 "--python": "python"}
FLAG_OPTIONS = {"--json": "as_json"}

Echo = Callable[..., Any]


def echo(message: str, err: bool = False) -> None:
    """What `click.echo(message, err=err)` writes, for text without an escape byte (with one,
    click.echo itself: it strips ANSI codes from a stream that is not a terminal).

    Only used where `plain_check_args` found streams that click would write to as they are.
    """
    if "\x1b" in message:
        import click  # noqa: PLC0415 - the rare text with an escape byte

        click.echo(message, err=err)
        return
    stream = sys.stderr if err else sys.stdout
    stream.write(message + "\n")
    stream.flush()


def plain_check_args(argv: Sequence[str]) -> dict[str, Any] | None:
    """The parameters click would give `check` for `argv` (the words after the program name),
    or None when `argv` is not a plain `check` command line (see the module's docstring)."""
    if len(argv) < 3 or argv[0] != "check" or not _plain_streams():
        return None
    params: dict[str, Any] = dict.fromkeys(VALUE_OPTIONS.values())
    params["as_json"] = False
    seen: set[str] = set()
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            rest = tuple(argv[i + 1:])
            if not rest:
                return None
            params["args"] = rest
            return params
        if word in seen:
            return None
        seen.add(word)
        if word in FLAG_OPTIONS:
            params[FLAG_OPTIONS[word]] = True
            i += 1
            continue
        if word not in VALUE_OPTIONS or i + 1 >= len(argv):
            return None
        value = argv[i + 1]
        if value.startswith("-") or (word == "--policy" and not _a_policy(value)):
            return None
        params[VALUE_OPTIONS[word]] = value
        i += 2
    return None


def _a_policy(value: str) -> bool:
    from sglang_guard.config.guardconfig import POLICY_MODES  # noqa: PLC0415 - check loads it

    return value in POLICY_MODES


def _plain_streams() -> bool:
    """Whether click would write to sys.stdout and sys.stderr as they are (it re-wraps a
    stream whose encoding is ASCII), and no shell completion is asked for."""
    import codecs  # noqa: PLC0415 - already loaded by the interpreter

    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None)
        if stream is None or not encoding:
            return False
        try:
            if codecs.lookup(encoding).name == "ascii":
                return False
        except LookupError:
            return False
    return not any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ)


def run_plain(params: dict[str, Any]) -> NoReturn:
    """`check` for parameters `plain_check_args` read; errors as `entry.guarded` says them."""
    try:
        run_check(echo=echo, **params)
    except (Exception, KeyboardInterrupt) as exc:  # SystemExit passes: the verdict's status
        exit_for(exc, echo)
    raise AssertionError("run_check exits")  # pragma: no cover


def exit_for(exc: BaseException, say: Echo) -> NoReturn:
    """A command's error as its exit status: a GuardError is one line and its status, ^C is
    130, anything else a bug (one line, unless SGLANG_GUARD_DEBUG asks for the traceback)."""
    if isinstance(exc, GuardError):
        say(f"sglang-guard: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        sys.exit(130)
    if os.environ.get("SGLANG_GUARD_DEBUG"):
        raise exc
    say(f"sglang-guard: internal error: {type(exc).__name__}: {exc} "
        "(set SGLANG_GUARD_DEBUG=1 for a traceback)", err=True)
    sys.exit(EXIT_INTERNAL)


def load_config(config_path: str | None, policy: str | None, gpu_sm: str | None,
                *, search_defaults: bool = False) -> GuardConfig:
    """The guard config with command-line overrides applied."""
    from sglang_guard.config.guardconfig import with_overrides  # noqa: PLC0415
    from sglang_guard.config.shell.configfile import locate, read_guard_config  # noqa: PLC0415

    cfg = read_guard_config(locate(config_path, search_defaults=search_defaults))
    return with_overrides(cfg, policy, gpu_sm)


def _server_args(launch: Launch, words: list[str], reading: ServeReading, as_json: bool,
                 echo: Echo) -> tuple[list[str], tuple[str, ...]]:
    """The launch_server arguments of a check's words, which may name their launcher
    (sglang/launcher.py), and the words the fixed line starts with (Launch.head). A
    `sglang serve` line is read as the release that runs reads it (`reading`): one its
    serve.py fails before parsing is an InputError with SGLang's own words; one SGLang
    would not serve with the LLM server (sglang/shell/servebackend.py) is said to be
    unchecked, and check exits 0."""
    own, server = launch.split(reading)
    if launch.form != "serve":
        return list(server), launch.head()
    from sglang_guard.sglang.launcher import serve_error  # noqa: PLC0415 - serve only
    from sglang_guard.sglang.shell.servebackend import backend  # noqa: PLC0415 - serve only

    failed = serve_error(launch.args, reading)
    if failed is not None:
        raise InputError(failed)
    why = backend(own, server, reading)
    if why is None:
        return list(server), launch.head(reading)
    if as_json:  # the line as given, its secrets masked as in every decision (ui.py)
        from sglang_guard.sglang.redact import redact_argv  # noqa: PLC0415
        from sglang_guard.sglang.releases import load_option_table  # noqa: PLC0415

        shown = redact_argv(words, load_option_table())  # the newest release's secret flags
        echo(json.dumps({"checked": False, "why": why, "argv_in": shown}, indent=2))
    else:
        echo(f"not checked: {why}; `sglang serve` runs it with that backend, whose flags "
             "and errors the guard has no table of")
    sys.exit(EXIT_OK)


def run_check(*, policy: str | None, gpu_sm: str | None, config_path: str | None,
              as_json: bool, state_dir: str | None, sglang_version: str | None,
              python: str | None, args: tuple[str, ...], echo: Echo,
              sglang_args: Callable[[GuardConfig, Sequence[str]], list[str]] | None = None,
              ) -> NoReturn:
    """Show what preflight decides for an SGLang command line, without launching; exit with
    the verdict's status. `sglang_args`: the SGLang arguments from `args` and the config
    (None: `args` themselves, which `plain_check_args` found not empty)."""
    from sglang_guard.preflight.shell.inputs import prepare  # noqa: PLC0415
    from sglang_guard.preflight.shell.whichrelease import resolve_release  # noqa: PLC0415
    from sglang_guard.sglang.launcher import read_launch, serve_reading  # noqa: PLC0415
    from sglang_guard.supervise.shell.statelock import default_run_state_dir  # noqa: PLC0415
    from sglang_guard.ui import decision_json, render_decision  # noqa: PLC0415

    cfg = load_config(config_path, policy, gpu_sm)
    words = sglang_args(cfg, args) if sglang_args is not None else list(args)
    launch = read_launch(words)
    runner = launch.runner
    if launch.form == "serve" and runner is not None:  # the `sglang` script's environment
        runner = str(Path(runner).with_name("python"))
    version = sglang_version or cfg.sglang.version
    # The release that runs: as told (--sglang-version, [sglang] version, --python, [sglang]
    # python), else that of the interpreter the pasted line names by path.
    here = runner is not None and Path(runner).is_file()  # not: a line from another host
    named = python or cfg.sglang.python or (None if version or not here else runner)
    release = resolve_release(
        version=version,
        version_source="--sglang-version" if sglang_version else "[sglang] version",
        python=named,
        unknown_why=(f"the command's {runner} is not on this machine" if runner and not here
                     else "no --python or --sglang-version given"))
    # A serve line as this release's `sglang serve` reads it (which words are its own).
    argv, head = _server_args(launch, words, serve_reading(release.version), as_json, echo)
    prepared = prepare(cfg.gpu_sm, cfg.policy, argv,
                       state_dir or cfg.state_dir or default_run_state_dir(argv), release)
    decision, inputs = prepared.decision, prepared.inputs
    assert decision is not None and inputs is not None  # noqa: S101 - preflight ran
    fleet = None
    if cfg.learn.enabled:  # fleet memory: what a guard would take from the store
        from sglang_guard.fleet.shell.fleet import check_view  # noqa: PLC0415

        fleet = check_view(cfg, state_dir or cfg.state_dir or default_run_state_dir(argv),
                           prepared)
    if as_json:
        doc = decision_json(decision, inputs)
        echo(json.dumps({**doc, "fleet": fleet} if fleet else doc, indent=2))
    else:
        echo(render_decision(decision, inputs, head))
        for line in fleet["lines"] if fleet else ():
            echo(line)
    verdict = decision.verdict
    if fleet and fleet["applied"] and verdict == "ok":
        verdict = "remediated"
    sys.exit(VERDICT_EXIT[verdict])
