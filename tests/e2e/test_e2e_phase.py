"""Real SGLang 0.5.23 on CPU (issue 12): requests quoting every fatal pattern, logged by
SGLang's own --log-requests, leave a ready server alone; a start that hangs in distributed
init is reported with its stage and acted on within the stage's limit.

What the first test exercises, honestly: the tiny model runs with --skip-tokenizer-init, so
a text prompt is rejected (HTTP 400) -- but SGLang logs it first ("Receive: obj=...
text='...'", tokenizer_manager.py:936 logs before it tokenizes), and input_ids requests
carry the pattern in their rid and stop strings, which the "Receive:" and "Finish:" records
print. The test checks SGLang really wrote those lines before it checks the journal.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from requestlines import FATAL_TEXTS
from sglang_guard.errors import EXIT_GIVE_UP, EXIT_OK

from .guardproc import guard_process, guard_run_cmd, post_generate, sglang_args
from .models import write_tiny_llama
from .server import free_port

pytestmark = pytest.mark.e2e

READY_S = 300.0


def _post(port: int, body: dict[str, Any]) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_requests_quoting_every_pattern_never_touch_a_ready_server(
        sglang_python: str, tmp_path: Path) -> None:
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    given = sglang_args(model, port, ["--log-requests", "--log-requests-level", "2"])
    toml = tmp_path / "guard.toml"
    toml.write_text("[health]\nliveness_interval_s = 600.0\n", encoding="utf-8")
    cmd = guard_run_cmd(sglang_python, state, given,
                        options=["--no-preflight", "--config", str(toml)])
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log") as guard:
        guard.wait_event("ready", READY_S)
        statuses = []
        for i, text in enumerate(FATAL_TEXTS):
            statuses.append(_post(port, {"text": text, "rid": f"t{i}",
                                         "sampling_params": {"max_new_tokens": 2}}))
            statuses.append(_post(port, {"input_ids": [1, 2, 3], "rid": f"{text} #{i}",
                                         "sampling_params": {"max_new_tokens": 2,
                                                             "stop": [text]}}))
        assert post_generate(port).get("output_ids"), "the server stopped serving"
        log = guard.log_path.read_text(encoding="utf-8", errors="replace")
        # SGLang itself logged the patterns inside its request records.
        received = [ln for ln in log.splitlines() if "Receive: obj=GenerateReqInput(" in ln]
        finished = [ln for ln in log.splitlines() if "Finish: obj=GenerateReqInput(" in ln]
        assert len(received) >= len(FATAL_TEXTS), f"{len(received)} Receive records"
        for text in FATAL_TEXTS:
            assert any(repr(text) in ln for ln in received), f"not logged: {text!r}"
        assert finished, f"no Finish record; statuses {sorted(set(statuses))}"
        guard.never("a remediation, crash or give-up",
                    lambda: any(guard.events(e) for e in ("remediated", "crash.detected",
                                                          "give_up.planned", "restored")),
                    5.0)
        assert len(guard.events("child.start")) == 1, guard.describe()
        assert guard.terminate() == EXIT_OK, guard.describe()
        guard.assert_tree_gone()


def test_rank_zero_alone_stalls_in_distributed_init_and_is_given_up(
        sglang_python: str, tmp_path: Path) -> None:
    """--nnodes 2 --node-rank 0 --tp 2 with no second node: waits in dist init forever."""
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    given = sglang_args(model, port, ["--nnodes", "2", "--node-rank", "0", "--tp", "2",
                                      "--dist-init-addr", f"127.0.0.1:{free_port()}"])
    toml = tmp_path / "guard.toml"
    limit = 20.0
    toml.write_text(f"[start]\ninit_s = 300.0\ndist_init_s = {limit}\non_stall = \"give_up\"\n"
                    "[restart]\nstop_grace_s = 5.0\n", encoding="utf-8")
    cmd = guard_run_cmd(sglang_python, state, given,
                        options=["--no-preflight", "--config", str(toml)])
    env = {**os.environ, "SGLANG_CPU_OMP_THREADS_BIND": "0|1"}  # TP 2 on CPU needs it
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log", env=env) as guard:
        stage = guard.wait_event("start.stage", 240)
        assert stage.get("stage") == "dist_init", guard.describe()
        stalled = guard.wait_event("start.stalled", limit + 30, allow_exit=True)
        assert stalled.get("stage") == "dist_init", stalled
        assert stalled.get("limit_s") == limit
        assert float(str(stalled.get("silent_s"))) >= limit
        assert stalled.get("line"), stalled
        code = guard.wait_exit(60)
        assert code == EXIT_GIVE_UP, guard.describe()
        assert len(guard.events("child.start")) == 1
        assert not guard.events("ready")
        guard.assert_tree_gone()
