"""`sglang-guard serve ARGS…`: exactly what `sglang serve ARGS…` takes, launched that way.

SGLang 0.5.23's `sglang serve` (sglang/cli/serve.py) takes the model path as its first
positional argument or as `--model-path`, picks a backend with `--model-type` (default
auto), and hands the rest to launch_server's parser. The guard reads the same argv: the
positional model becomes `--model-path` for preflight, `--model-type` stays with the launch
command, and the child is `sglang serve …`. Guard settings come from the environment and
config files, as for the drop-in launcher; the run itself is entry.py's.

A diffusion pipeline is not the LLM server: `sglang serve` hands it to SGLang's diffusion
runtime (sglang/cli/serve.py:109-118 `_detect_diffusion`, :211 `auto_detect`), whose flags,
defaults and error output none of the guard's tables describe. Checking its flags against
launch_server's would refuse or rewrite flags that are right there, so such a command is
handed to `sglang serve` as written, unguarded, with one line that says why (`backend`).
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
from sglang_guard.errors import InputError

_SELECTOR = "--model-type"
# Which files make a local directory a diffusers pipeline, for SGLang 0.5.23's `sglang serve`
# (sglang/cli/utils.py:70-77 `_is_diffusers_model_dir`: the first that exists decides, by a
# "_diffusers_version" key).
_PIPELINE_INDEXES = ("model_index.json", "modular_model_index.json")
_INDEX_LIMIT = 1 << 20  # a pipeline index is a few hundred bytes; more is not one


def selected_backend(own: Sequence[str]) -> str:
    """The backend `--model-type` selects ("auto" when none: serve.py:30-61 reads it so)."""
    chosen = "auto"
    for i, arg in enumerate(own):
        if arg == _SELECTOR and i + 1 < len(own):
            chosen = own[i + 1]
        elif arg.startswith(f"{_SELECTOR}="):
            chosen = arg.split("=", 1)[1]
    return chosen


def model_path_of(server_args: Sequence[str]) -> str | None:
    """The model path as serve.py finds it before parsing (sglang/cli/utils.py:136-149
    `try_get_model_path`: the first `--model-path`/`--model`, spaced or with `=`)."""
    for i, arg in enumerate(server_args):
        if arg in ("--model-path", "--model"):
            return server_args[i + 1] if i + 1 < len(server_args) else None
        if arg.startswith(("--model-path=", "--model=")):
            return arg.split("=", 1)[1]
    return None


def _is_pipeline_dir(directory: Path) -> bool:
    import json  # noqa: PLC0415 - only a serve command reads a pipeline index

    for name in _PIPELINE_INDEXES:
        index = directory / name
        if index.is_file():
            try:
                with index.open("rb") as fh:
                    data = json.loads(fh.read(_INDEX_LIMIT))
            except (OSError, ValueError):
                return False  # SGLang's json.load raises; its detector then says no match
            # SGLang's own test, whatever the JSON holds: a list or a string that contains
            # the word passes it too; a number raises, and its detector says no match.
            return isinstance(data, dict | list | str) and "_diffusers_version" in data
    return False


def _cached_pipeline_index(repo_id: str) -> Path | None:
    """The hub model's model_index.json from the local Hugging Face cache, if there."""
    try:
        from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "model_index.json")
    except ValueError:  # not a repo id
        return None
    return Path(found) if isinstance(found, str) else None


def backend(own: Sequence[str], server_args: Sequence[str]) -> str | None:
    """Why SGLang would not serve this with the LLM server (then the guard, which knows only
    that one, must not judge it), or None: it is the LLM server's.

    As SGLang 0.5.23 decides: `--model-type` other than llm/auto selects another backend
    (diffusion, or an installed out-of-tree one: serve_backends.py); under auto, a model
    directory with a diffusers pipeline index (utils.py:111-112), a hub model whose cached
    model_index.json is one (utils.py:124-128: SGLang downloads it; the guard reads the
    local cache only), or an explicit `--pipeline-class-name` (serve.py:113-116; SGLang
    checks it against its pipeline registry, which only its diffusion runtime holds).
    """
    chosen = selected_backend(own)
    if chosen not in ("auto", "llm"):
        return f"--model-type {chosen} selects SGLang's {chosen} backend"
    if chosen == "llm":
        return None
    path = model_path_of(server_args)
    if path is not None:
        local = Path(path).expanduser()
        if local.is_dir():
            if _is_pipeline_dir(local):
                return f"{path} is a diffusers pipeline (its model index has _diffusers_version)"
        elif (index := _cached_pipeline_index(path)) is not None and _is_pipeline_dir(
                index.parent):
            return f"{path} is a diffusers pipeline (its cached model_index.json)"
    if any(a == "--pipeline-class-name" or a.startswith("--pipeline-class-name=")
           for a in server_args):
        return "--pipeline-class-name names a diffusion pipeline"
    return None


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


def is_serve_launch(launch: Sequence[str]) -> bool:
    """Whether a configured launch command is `sglang serve` (`[sglang] launch`)."""
    return len(launch) >= 2 and launch[-1] == "serve" and Path(launch[-2]).name == "sglang"


def hand_over(serve: Sequence[str], args: Sequence[str]) -> None:
    """Exec `serve` (a `sglang serve` command) with `args` as written when SGLang would not
    serve them with the LLM server (`backend`), saying why in one line; else return."""
    why = backend(*split_args(args))
    if why is None:
        return
    sys.stderr.write(f"sglang-guard: {why}, which the guard does not check or supervise: "
                     "running `sglang serve` unguarded\n")
    sys.stderr.flush()
    command = [*serve, *args]
    try:
        os.execvp(command[0], command)  # noqa: S606 - an argv, no shell, as SGLang's
    except OSError as exc:
        raise InputError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from exc


@guarded
def _serve(args: list[str]) -> None:
    cfg = guard_config_from_env()
    own, server_args = split_args(args)
    py = os.environ.get("SGLANG_GUARD_PYTHON") or cfg.sglang.python or sys.executable
    serve = cfg.sglang.launch or (*sglang_command(py), "serve")
    hand_over(serve, args)
    launch = (*serve, *own)
    cfg = replace(cfg, sglang=replace(cfg.sglang, launch=launch, python=py))
    run_process(cfg, server_args, python=py, preflight=preflight_from_env())
