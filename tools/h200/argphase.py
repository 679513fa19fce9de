"""Run SGLang's own argument phase on each command line of a cases file; one JSON line each.

    ARGPHASE_JOBS=15 python tools/h200/argphase.py CASES.jsonl MODELS_DIR OUT.jsonl

Each case is {"id": ..., "argv": [...]} with "{models}" in a model path standing for
MODELS_DIR. For each, a worker process runs `prepare_server_args(argv)` and, where the release
has it, `resolve_once()` and `check_server_args()` (what `Engine._launch_subprocesses`,
srt/entrypoints/engine.py:1153-1165 of 0.5.23, does before any process or weight starts), and
reports accepted/rejected, the exception and the SGLang frame that raised it.
Workers are fresh interpreters (CUDA cannot be re-initialised in a forked child); each runs
its cases one after another in-process, putting os.environ back after each.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import sgl_kernel_standin

_RESOLVED = ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
             "speculative_draft_attention_backend", "page_size", "kv_cache_dtype",
             "quantization", "context_length", "tp_size", "moe_dense_tp_size",
             "speculative_algorithm", "speculative_eagle_topk", "speculative_num_draft_tokens",
             "speculative_num_steps", "moe_runner_backend", "moe_a2a_backend")


def _where(tb: Any) -> str | None:
    """The innermost frame inside the sglang package, as path:line relative to it."""
    found = None
    for frame in traceback.extract_tb(tb):
        marker = f"{os.sep}sglang{os.sep}"
        if marker in frame.filename:
            found = f"sglang/{frame.filename.rsplit(marker, 1)[1]}:{frame.lineno}"
    return found


def _child(argv: list[str]) -> dict[str, Any]:
    from sglang.srt.server_args import prepare_server_args

    try:
        sa = prepare_server_args(argv)
        if hasattr(sa, "resolve_once"):
            sa.resolve_once()
        if hasattr(sa, "check_server_args"):  # engine.py:1165, still before any weight loads
            sa.check_server_args()
    except SystemExit as exc:
        return {"outcome": "rejected", "error": "SystemExit", "code": exc.code}
    except BaseException as exc:
        return {"outcome": "rejected", "error": type(exc).__name__,
                "message": str(exc)[:2000], "where": _where(exc.__traceback__)}
    resolved = {k: getattr(sa, k, None) for k in _RESOLVED if hasattr(sa, k)}
    return {"outcome": "accepted",
            "resolved": {k: v if isinstance(v, (int, str, float, bool, type(None))) else str(v)
                         for k, v in resolved.items()}}


def _run_in_process(argv: list[str]) -> dict[str, Any]:
    """One case in this process: its stderr caught, os.environ put back afterwards."""
    env = dict(os.environ)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            answer = _child(argv)
    finally:
        os.environ.clear()
        os.environ.update(env)
    if answer.get("error") == "SystemExit":
        lines = [ln for ln in err.getvalue().strip().splitlines() if ln.strip()]
        answer["message"] = lines[-1] if lines else ""
    return answer


def _worker(cases_p: str, models: str, out_p: str, index: int, count: int) -> None:
    """Run every `count`-th case from `index`, in this process, one JSON line each."""
    sgl_kernel_standin.install()
    import sglang

    version = getattr(sglang, "__version__", "?")
    cases = [json.loads(ln) for ln in Path(cases_p).read_text(encoding="utf-8").splitlines()
             if ln.strip()]
    with Path(out_p).open("w", encoding="utf-8") as out:
        for i in range(index, len(cases), count):
            case = cases[i]
            argv = [a.replace("{models}", models) for a in case["argv"]]
            try:
                answer = _run_in_process(argv)
            except BaseException as exc:
                answer = {"outcome": "harness_error", "message": repr(exc)}
            out.write(json.dumps({"i": i, "id": case["id"], "argv": case["argv"],
                                  "sglang": version, **answer}) + "\n")
            out.flush()


def main() -> None:
    """Entry point: N fresh worker processes (CUDA is initialised once in each, never forked)."""
    if sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
        return
    cases_p, models, out_p = sys.argv[1], sys.argv[2], sys.argv[3]
    jobs = int(os.environ.get("ARGPHASE_JOBS", "8"))
    parts = [f"{out_p}.part{i}" for i in range(jobs)]
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", cases_p, models, part,
                               str(i), str(jobs)]) for i, part in enumerate(parts)]
    for proc in procs:
        proc.wait()
    rows = []
    for part in parts:
        if Path(part).exists():
            rows += [json.loads(ln) for ln in Path(part).read_text().splitlines() if ln.strip()]
    rows.sort(key=lambda r: r["i"])
    with Path(out_p).open("w", encoding="utf-8") as out:
        for row in rows:
            row.pop("i")
            out.write(json.dumps(row) + "\n")
    for part in parts:
        Path(part).unlink(missing_ok=True)
    print(f"done: {len(rows)} cases", flush=True)


if __name__ == "__main__":
    main()
