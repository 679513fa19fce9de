"""Watched files while SGLang runs: an edit that changes the effective command line restarts
SGLang once; one that does not restarts nothing; an invalid file keeps the last good one.

Files are edited the way editors do; every wait is on journal events.
"""

from __future__ import annotations

import signal
from pathlib import Path

from sglang_guard.errors import EXIT_OK
from support.guards import Guard, finish, guard_toml
from support.harness import HealthServer, Launcher, count, journal_events, ready_then_wait, wait_for


def _events(state: Path, name: str) -> list[dict[str, object]]:
    return [r for r in journal_events(state) if r["event"] == name]


def test_yaml_edit_restarts_once_invalid_yaml_keeps_serving(
        tmp_path: Path, pack: Path, guard: Guard) -> None:
    launcher = Launcher(tmp_path, [ready_then_wait()])
    yaml_file = tmp_path / "sglang.yaml"
    yaml_file.write_text("max-running-requests: 8\n")
    state = tmp_path / "state"
    with HealthServer() as server:
        config = guard_toml(tmp_path, launcher, pack, max_failures=3)
        proc = guard(config, ["--model-path", "/models/fake", "--port", str(server.port),
                              "--config", str(yaml_file)])
        wait_for(lambda: count(state, "ready") == 1, what="first ready")

        # 1. The YAML is written in place with a new value: one graceful restart.
        yaml_file.write_text("max-running-requests: 16\n")
        wait_for(lambda: count(state, "ready") == 2, what="ready after the restart")
        applied = _events(state, "reload.applied")
        assert [r["restart"] for r in applied] == [True]
        assert applied[0]["changed"] == ["--max-running-requests"]
        assert count(state, "restart.planned") == 1
        assert count(state, "child.start") == 2

        # 2. Invalid YAML (written via a temp file renamed over): rejected, nothing restarts.
        tmp = yaml_file.with_name(".sglang.yaml.tmp")
        tmp.write_text("max-running-requests: [16\n")
        tmp.replace(yaml_file)
        rejected = wait_for(lambda: _events(state, "reload.rejected"), what="reload.rejected")
        assert "YAML" in str(rejected[0]["error"])

        # 3. A rule pack edit: applied without a restart. Events are handled in order, so
        #    once this is journaled, a restart from step 2 would have shown up already.
        pack.write_text(pack.read_text() + "\n# a comment\n")
        wait_for(lambda: len(_events(state, "reload.applied")) == 2, what="pack reload")
        assert _events(state, "reload.applied")[1]["restart"] is False
        assert count(state, "child.start") == 2

        # 4. Deleted and recreated with the value SGLang already runs with: no restart.
        yaml_file.unlink()
        yaml_file.write_text("max-running-requests: 16\n")
        wait_for(lambda: len(_events(state, "reload.applied")) == 3, what="yaml recreated")
        assert _events(state, "reload.applied")[2]["restart"] is False
        assert count(state, "child.start") == 2
        assert [len(a) for a in launcher.argvs()] == [6, 6]

        proc.send_signal(signal.SIGTERM)
        code, _, _ = finish(proc)
    assert code == EXIT_OK


def test_guard_config_edit_without_command_change_restarts_nothing(
        tmp_path: Path, pack: Path, guard: Guard) -> None:
    launcher = Launcher(tmp_path, [ready_then_wait()])
    state = tmp_path / "state"
    with HealthServer() as server:
        config = guard_toml(tmp_path, launcher, pack, max_failures=3)
        proc = guard(config, ["--model-path", "/models/fake", "--port", str(server.port)])
        wait_for(lambda: count(state, "ready") == 1, what="ready")
        config.write_text(config.read_text().replace("stop_grace_s = 2.0", "stop_grace_s = 3.0"))
        wait_for(lambda: _events(state, "reload.applied"), what="reload.applied")
        assert _events(state, "reload.applied")[0]["restart"] is False
        config.write_text("[restart\n")  # broken TOML: reported, the old config keeps serving
        rejected = wait_for(lambda: _events(state, "reload.rejected"), what="reload.rejected")
        assert "guard.toml" in str(rejected[0]["error"])
        assert count(state, "child.start") == 1
        proc.send_signal(signal.SIGTERM)
        code, _, _ = finish(proc)
    assert code == EXIT_OK
