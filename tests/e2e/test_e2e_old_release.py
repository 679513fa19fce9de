"""`sglang-guard run` in front of real SGLang 0.5.18 on CPU: a failure only that release has.

0.5.18 picks the tc_piecewise prefill CUDA-graph backend on CPU and its capture fails
(`RuntimeError: Capture prefill CUDA graph failed: Could not run
'sglang::unified_attention_with_output' with arguments from the 'CPU' backend`,
prefill_cuda_graph_runner.py:374 of 0.5.18); 0.5.23 starts the same command line. The guard,
launching 0.5.18's python, reads the release from its dist-info, lets preflight pass the
command line unchanged, catches SGLang's own fatal line and restarts with the advice
`--cuda-graph-backend-prefill disabled`, which 0.5.18's parser accepts; the restart serves.
Nothing is scripted: the failure and the fix are real.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_guard.errors import EXIT_OK

from .guardproc import (
    GuardProc,
    guard_process,
    guard_run_cmd,
    post_generate,
    sglang_args,
    write_guard_toml,
)
from .models import write_tiny_llama
from .server import free_port

pytestmark = pytest.mark.e2e

READY_S = 300.0  # two launches of 0.5.18 on 2 cores: ~35 s to fail, ~45 s to ready
CAPTURE_MSG = "Capture prefill CUDA graph failed: "
CPU_CAUSE = "sglang::unified_attention_with_output"
FIX = ["--cuda-graph-backend-prefill", "disabled"]


def _argv_of(record: dict[str, object]) -> list[str]:
    argv = record.get("argv")
    assert isinstance(argv, list), f"child.start without an argv list: {record}"
    return [str(a) for a in argv]


def _release_line(guard: GuardProc) -> str:
    log = guard.log_path.read_text(encoding="utf-8", errors="replace")
    return next((line for line in log.splitlines() if '"sglang.release"' in line), "")


def test_prefill_capture_failure_is_fixed_with_the_releases_own_advice(
    sglang_python_0_5_18: str, tmp_path: Path
) -> None:
    """0.5.18 dies capturing the prefill CUDA graph; the guard disables it, restarts, serves."""
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    given = sglang_args(model, port)
    toml = write_guard_toml(tmp_path / "guard.toml")
    cmd = guard_run_cmd(sglang_python_0_5_18, state, given, options=["--config", str(toml)])
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log") as guard:
        guard.wait_event("ready", READY_S)
        assert '"version": "0.5.18"' in _release_line(guard), (
            f"the guard did not decide for 0.5.18: {_release_line(guard)!r}")

        fixes = guard.events("remediated")
        assert len(fixes) == 1, f"expected one remediation, got {fixes}; {guard.describe()}"
        fix = fixes[0]
        assert fix.get("trigger") == "log", fix
        assert fix.get("rule") == "prefill-cuda-graph-capture-failed", fix
        assert fix.get("flag") == "--cuda-graph-backend-prefill", fix
        assert (fix.get("action"), fix.get("new_value")) == ("set_flag", "disabled"), fix
        line = str(fix.get("line"))
        assert CAPTURE_MSG in line and CPU_CAUSE in line, f"fixed on another line: {line}"

        starts = guard.events("child.start")
        assert len(starts) == 2, f"expected the failed launch and one restart: {starts}"
        assert _argv_of(starts[0]) == given, "preflight changed a command line 0.5.18 parses"
        assert _argv_of(starts[1]) == [*given, *FIX]
        assert guard.events("ready")[0].get("gen") == starts[1].get("gen")

        answer = post_generate(port)
        assert answer.get("output_ids"), f"/generate answered {answer}; {guard.describe()}"
        code = guard.terminate()
        assert code == EXIT_OK, f"guard exited {code} after SIGTERM; {guard.describe()}"
        guard.assert_tree_gone()
