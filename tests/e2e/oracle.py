"""Ask real SGLang what it makes of models and command lines (run with a SGLang venv's python).

    <py> tests/e2e/oracle.py arch  < [{"dir": ..., "is_draft": false, "override_args": null}, ...]
    <py> tests/e2e/oracle.py parse < [["--model-path", "m", "--attention-backend", "fa3"], ...]
    <py> tests/e2e/oracle.py serve < [["/models/pipe", "--num-gpus", "1"], ...]

One process answers a whole batch (importing SGLang takes ~15 s). Each answer is one JSON list
on stdout, in input order; a failure in one item is reported in that item, never fatal. SGLang's
own logging goes to stderr so stdout stays parseable.

`parse` mode: in 0.5.23 `prepare_server_args(argv)` (srt/server_args.py:668) only merges
`--config`, parses, and builds the record: `ServerArgs.__post_init__` (server_args.py:241) is
empty on purpose. The hooks that need hardware (GPU memory, SM, backend auto-pick, reading the
model) run later in `ServerArgs.resolve_once()` ->
`arg_groups/pipeline.py::run_resolution_pipeline`, which `launch_server` calls. So
`prepare_server_args` is the CPU-safe step and the one used here: it reads argv exactly as
`launch_server` does (choices, types, aliases, prefix abbreviations, the `--config` YAML
merge). `parse --resolve` also tries `resolve_once()`
and reports its error in `resolve_error` (it needs the model on disk; expect GPU errors).

Older releases (0.5.18) have no `resolve_once`: their `ServerArgs.__post_init__`
(0.5.18 server_args.py:3585) runs the whole resolution pipeline, hardware hooks included, from
inside `prepare_server_args` (server_args.py:9770, via `from_cli_args`, :8921). There the
same `prepare_server_args` runs with `__post_init__` held back, so it does what 0.5.23's does
(parser, `--config` merge, `parse_args`, the record); `--resolve` then runs the held-back
`_run_resolution_pipeline()`. The record's fields are `dataclasses.fields` there (0.5.18 has
no `arg_utils.record_fields`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

# Only importable in the SGLang venv (this file runs there, never in the guard's python).
from sglang.srt.configs.model_config import ModelConfig  # type: ignore[import-not-found]
from sglang.srt.server_args import (  # type: ignore[import-not-found]
    ServerArgs,
    prepare_server_args,
)

try:
    from sglang.srt.arg_groups.arg_utils import record_fields  # type: ignore[import-not-found]
except ImportError:  # 0.5.18: a plain dataclass
    record_fields = dataclasses.fields

# 0.5.23 resolves in a separate step; before it, __post_init__ did (see the docstring).
RESOLVES_IN_POST_INIT = not hasattr(ServerArgs, "resolve_once")

BACKEND_FIELDS = (
    "attention_backend",
    "prefill_attention_backend",
    "decode_attention_backend",
    "speculative_draft_attention_backend",
)


def _one_line(exc: BaseException) -> str:
    """An exception as `Type: message` on one line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def arch(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """attention_arch and architectures (after draft renames) for each model dir."""
    out = []
    for item in items:
        row: dict[str, Any] = {"dir": item["dir"], "attention_arch": None,
                               "architectures": None, "error": None}
        try:
            config = ModelConfig(
                model_path=item["dir"],
                is_draft_model=bool(item.get("is_draft", False)),
                model_override_args=item.get("override_args") or "{}",
                trust_remote_code=False,
            )
            row["attention_arch"] = config.attention_arch.name.lower()
            row["architectures"] = list(config.hf_config.architectures or [])
        except BaseException as exc:  # one bad model must not end the batch
            row["error"] = _one_line(exc)
        out.append(row)
    return out


def _fields(server_args: Any) -> dict[str, str]:
    """Every field of the ServerArgs record, as strings."""
    return {f.name: str(getattr(server_args, f.name, None))
            for f in record_fields(type(server_args))}


@contextlib.contextmanager
def _parse_only() -> Iterator[None]:
    """Hold back a resolving `__post_init__` (0.5.18) while prepare_server_args runs."""
    if not RESOLVES_IN_POST_INIT:
        yield
        return
    saved = ServerArgs.__post_init__
    ServerArgs.__post_init__ = lambda self: None
    try:
        yield
    finally:
        ServerArgs.__post_init__ = saved


def _resolver(server_args: Any) -> Callable[[], None]:
    """The hardware-aware resolution step of this release."""
    if RESOLVES_IN_POST_INIT:
        return server_args._run_resolution_pipeline
    return server_args.resolve_once


def _parse_one(argv: list[str], resolve: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"argv": argv, "exit_code": None, "error": None, "full": None}
    stderr = io.StringIO()
    try:
        # argparse reports errors by printing, then SystemExit(2): keep its last line.
        with contextlib.redirect_stderr(stderr), _parse_only():
            server_args = prepare_server_args(list(argv))
    except SystemExit as exc:
        lines = stderr.getvalue().strip().splitlines()
        row["exit_code"] = exc.code
        row["error"] = lines[-1] if lines else f"SystemExit({exc.code})"
        return row
    except Exception as exc:  # a bad --config YAML raises, say
        row["error"] = _one_line(exc)
        return row
    for name in BACKEND_FIELDS:
        row[name] = getattr(server_args, name, None)
    row["full"] = _fields(server_args)
    if resolve:
        row["resolve_error"] = None
        try:
            _resolver(server_args)()
        except BaseException as exc:  # hardware hooks fail in many ways on CPU
            row["resolve_error"] = _one_line(exc)
    return row


def parse(items: list[list[str]], resolve: bool = False) -> list[dict[str, Any]]:
    """Backend fields (and every field, as strings) of each argv as SGLang parses it."""
    return [_parse_one(list(argv), resolve) for argv in items]


def serve(items: list[list[str]]) -> list[str]:
    """The backend `sglang serve ARGV` dispatches to, as its `serve` decides before it runs
    one (sglang/cli/serve.py `serve`: the selector, the positional model path, then
    `auto_detect`, which falls back to "llm" and skips a detector that raises)."""
    from sglang.cli import serve as cli_serve  # noqa: PLC0415 - SGLang's venv only
    from sglang.cli.serve_backends import (  # noqa: PLC0415
        ServeBackendDetection,
        ServeRequest,
    )
    from sglang.cli.utils import try_get_model_path  # noqa: PLC0415

    out = []
    for argv in items:
        name, rest = cli_serve._extract_model_type_override(list(argv))
        rest, positional = cli_serve._normalize_positional_model_path(rest)
        if name != "auto":
            out.append(name)
            continue
        request = ServeRequest(argv=tuple(rest), model_path=try_get_model_path(rest),
                               model_path_is_positional=positional)
        try:
            found = cli_serve._detect_diffusion(request)
        except Exception:  # auto_detect logs and skips a detector that raises
            found = ServeBackendDetection.NO_MATCH
        out.append("diffusion" if found is ServeBackendDetection.MATCH else "llm")
    return out


def main() -> int:
    """Read the batch on stdin, answer on stdout."""
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("arch", "parse", "serve"):
        print("usage: oracle.py arch|parse [--resolve]|serve < batch.json", file=sys.stderr)
        return 2
    items = json.load(sys.stdin)
    # SGLang and transformers log to stdout in places; keep stdout for the answer alone.
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        result = (arch(items) if mode == "arch" else serve(items) if mode == "serve"
                  else parse(items, "--resolve" in sys.argv[2:]))
    finally:
        sys.stdout = real_stdout
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
