"""Fleet memory in front of real SGLang 0.5.23 on CPU: one guard learns, the next one knows.

The seed case: `--attention-backend cutedsl_mla` on the tiny Llama, with `--no-preflight` so
that the log path learns it from SGLang's own fatal line. The first guard fails once, fixes
it, reaches ready and publishes; the second guard (its own state dir, another port) looks the
key up and its first launch serves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_guard.errors import EXIT_OK
from sglang_guard.fleet import fleet
from sglang_guard.fleet.shell.fleetstore import FileStore

from .guardproc import guard_process, guard_run_cmd, post_generate, sglang_args
from .models import write_tiny_llama
from .server import free_port

pytestmark = pytest.mark.e2e

READY_S = 300.0
CUTEDSL = ("--attention-backend", "cutedsl_mla")


def _toml(path: Path, store: Path) -> Path:
    path.write_text("\n".join(["[health]", "liveness_interval_s = 600.0",
                               "[learn]", f'store = "file://{store}"']) + "\n")
    return path


def test_the_second_guards_first_launch_serves_with_what_the_first_learned(
        sglang_python: str, tmp_path: Path) -> None:
    model, store = write_tiny_llama(tmp_path / "llama"), tmp_path / "fleet"
    toml = _toml(tmp_path / "guard.toml", store)
    first_state = tmp_path / "state-1"
    given = sglang_args(model, free_port(), CUTEDSL)
    cmd = guard_run_cmd(sglang_python, first_state, given,
                        options=["--no-preflight", "--config", str(toml)])
    with guard_process(cmd, state_dir=first_state, log_path=tmp_path / "guard-1.log") as guard:
        guard.wait_event("fleet.published", READY_S)
        assert len(guard.events("child.start")) == 2  # the fatal line cost one launch
        assert guard.terminate() == EXIT_OK
        guard.assert_tree_gone()
    key = guard.events("fleet.published")[0]["key"]
    entry = fleet.decode_entry(FileStore(str(store), 86400).get(key) or b"", key)
    assert entry.edits == (fleet.FleetEdit("--attention-backend", "drop_flag", "cutedsl_mla"),)
    assert entry.status == "proven" and entry.launches == 1

    second_state, port = tmp_path / "state-2", free_port()
    given = sglang_args(model, port, CUTEDSL)
    cmd = guard_run_cmd(sglang_python, second_state, given,
                        options=["--no-preflight", "--config", str(toml)])
    with guard_process(cmd, state_dir=second_state, log_path=tmp_path / "guard-2.log") as guard:
        guard.wait_event("fleet.confirmed", READY_S)
        starts = guard.events("child.start")
        assert len(starts) == 1, f"the second guard launched more than once: {starts}"
        assert "cutedsl_mla" not in starts[0]["argv"]
        assert not guard.events("child.exit")
        fix = guard.events("remediated")
        assert [(r["trigger"], r["flag"]) for r in fix] == [("fleet", "--attention-backend")]
        assert post_generate(port).get("output_ids")
        assert guard.terminate() == EXIT_OK
        guard.assert_tree_gone()
    again = fleet.decode_entry(FileStore(str(store), 86400).get(key) or b"", key)
    assert again.confirmations == 1
    assert "sekrit" not in json.dumps(again.to_json())
