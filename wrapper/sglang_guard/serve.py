"""`sglang-guard serve ARGS…`: exactly what `sglang serve ARGS…` takes, launched that way.

SGLang 0.5.23's `sglang serve` (sglang/cli/serve.py) takes the model path as its first
positional argument or as `--model-path`, picks a backend with `--model-type` (default
auto), and hands the rest to launch_server's parser. The guard reads the same argv: the
positional model becomes `--model-path` for preflight, `--model-type` stays with the launch
command, and the child is `sglang serve …`. Guard settings come from the environment and
config files, as for the drop-in launcher; the run itself is entry.py's.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from sglang_guard.entry import (
    guard_config_from_env,
    guarded,
    preflight_from_env,
    print_sglang_help,
    python,
    run_process,
)

_SELECTOR = "--model-type"


def split_args(args: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(`sglang serve`'s own options, the server arguments), read as serve.py reads them."""
    own: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == _SELECTOR and i + 1 < len(args):
            own += [arg, args[i + 1]]
            i += 2
            continue
        if arg.startswith(f"{_SELECTOR}="):
            own.append(arg)
        else:
            rest.append(arg)
        i += 1
    if rest and not rest[0].startswith("-"):  # `sglang serve MODEL …`
        rest = ["--model-path", rest[0], *rest[1:]]
    return tuple(own), tuple(rest)


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


@guarded
def _serve(args: list[str]) -> None:
    cfg = guard_config_from_env()
    own, server_args = split_args(args)
    py = os.environ.get("SGLANG_GUARD_PYTHON") or cfg.sglang.python or sys.executable
    launch = (*(cfg.sglang.launch or (*sglang_command(py), "serve")), *own)
    cfg = replace(cfg, sglang=replace(cfg.sglang, launch=launch, python=py))
    run_process(cfg, server_args, python=py, preflight=preflight_from_env())
