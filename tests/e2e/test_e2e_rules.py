"""Rules of issue 12 against real SGLang 0.5.23 on CPU: the guard fixes what SGLang names."""

from __future__ import annotations

from pathlib import Path

import pytest

from .guardproc import guard_process, guard_run_cmd, post_generate, write_guard_toml
from .models import write_tiny_llama
from .server import free_port

pytestmark = pytest.mark.e2e

READY_S = 300.0
KV_MSG = "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.01"


def test_kv_budget_is_raised_just_above_what_sglang_names(sglang_python: str,
                                                          tmp_path: Path) -> None:
    """0.01 leaves no KV cache; SGLang says which value would; the guard sets it and serves.

    No --max-total-tokens here (the other CPU cases pass it, and it skips this check).
    """
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    given = ["--model-path", str(model), "--device", "cpu", "--load-format", "dummy",
             "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(port),
             "--mem-fraction-static", "0.01"]
    toml = write_guard_toml(tmp_path / "guard.toml")
    cmd = guard_run_cmd(sglang_python, state, given,
                        options=["--no-preflight", "--config", str(toml)])
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log") as guard:
        guard.wait_event("ready", READY_S)
        fixes = guard.events("remediated")
        assert len(fixes) == 1, f"expected one remediation, got {fixes}; {guard.describe()}"
        fix = fixes[0]
        assert fix.get("rule") == "kv-no-memory-raise-above", fix
        assert KV_MSG in str(fix.get("line")), fix
        assert fix.get("old_value") == "0.01", fix
        assert float(str(fix.get("new_value"))) > 0.01, fix  # up, as the message says
        answer = post_generate(port)
        assert answer.get("output_ids"), f"/generate answered {answer}; {guard.describe()}"
        assert guard.terminate() == 0, guard.describe()
