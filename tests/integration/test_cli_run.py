"""`sglang-guard run` as a process: a guard TOML whose `[sglang] launch` runs the fake child.

Signals go to the guard process itself; every wait is a bounded poll on the journal, a file
or a process, never a bare sleep.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import pytest

from sglang_guard.errors import EXIT_GIVE_UP, EXIT_OK, EXIT_USAGE
from sglang_guard.supervise.machine import READY_LINE
from support.guards import Guard, argv_for, finish, guard_toml, leftovers
from support.harness import (
    HealthServer,
    Launcher,
    count,
    journal_events,
    ready_then_wait,
    wait_for,
)
from support.pack import FA3_LINE, PACK_TEXT
from support.procs import free_port, wait_gone


def test_fatal_line_fix_restart_ready_then_term_exits_0_and_leaves_nothing(
        tmp_path: Path, pack: Path, guard: Guard) -> None:
    pids = tmp_path / "pids.json"
    launcher = Launcher(tmp_path, [
        [["print", "stderr", FA3_LINE], ["exit", 1]],
        [["spawn", 2, False], ["pidfile", str(pids)], *ready_then_wait()],
    ])
    state = tmp_path / "state"
    with HealthServer() as server:
        argv = argv_for(server.port, "--attention-backend", "fa3")
        proc = guard(guard_toml(tmp_path, launcher, pack, stop_grace_s=0.3), argv)
        wait_for(lambda: count(state, "ready") >= 1, what="ready")
        info = json.loads(pids.read_text())
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == EXIT_OK, err
    assert READY_LINE in out  # the child's output passes through
    assert wait_gone([info["pid"], *info["children"]], timeout=10) == []
    assert leftovers(launcher) == []
    first, second = launcher.argvs()
    assert first == argv
    assert second == argv_for(server.port)  # --attention-backend fa3 dropped, nothing else

    records = journal_events(state)
    assert all(isinstance(r.get("ts"), str) and r.get("event") for r in records)
    events = [r["event"] for r in records]
    for name in ("child.start", "remediated", "child.exit", "ready", "guard.signal", "guard.exit"):
        assert name in events, name
    rem = next(r for r in records if r["event"] == "remediated")
    assert {k: rem[k] for k in ("trigger", "rule", "flag", "action", "line")} == {
        "trigger": "log", "rule": "fa3-sm", "flag": "--attention-backend",
        "action": "drop_flag", "line": FA3_LINE}
    redacted = ["--model-path", "/models/fake", "--port", str(server.port), "--api-key", "***"]
    assert rem["argv_before"] == [*redacted, "--attention-backend", "fa3"]
    assert rem["argv_after"] == redacted
    assert records[-1]["event"] == "guard.exit"
    assert records[-1]["code"] == 0
    assert "sekrit-9" not in (state / "journal.jsonl").read_text()
    assert "sekrit-9" not in err


def test_crash_loop_exits_75_in_bounded_time(tmp_path: Path, pack: Path, guard: Guard) -> None:
    launcher = Launcher(tmp_path, [[["print", "stdout", "crashing"], ["exit", 2]]])
    started = time.monotonic()
    proc = guard(guard_toml(tmp_path, launcher, pack, max_failures=3), argv_for(free_port()))
    code, out, err = finish(proc)
    assert code == EXIT_GIVE_UP
    assert time.monotonic() - started < 20
    assert out.count("crashing") == 3
    assert "crash loop: 3 failures" in err
    assert len(launcher.argvs()) == 3


def test_child_ignoring_sigterm_is_killed_after_the_grace(
        tmp_path: Path, pack: Path, guard: Guard) -> None:
    pids = tmp_path / "pids.json"
    launcher = Launcher(tmp_path, [[
        ["ignore_term"], ["spawn", 2, False], ["pidfile", str(pids)],
        ["print", "stdout", READY_LINE], ["pause"],
    ]])
    state = tmp_path / "state"
    with HealthServer() as server:
        proc = guard(guard_toml(tmp_path, launcher, pack, stop_grace_s=0.5),
                     argv_for(server.port))
        wait_for(lambda: count(state, "ready") >= 1, what="ready")
        info = json.loads(pids.read_text())
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code, _, err = finish(proc)
    assert code == EXIT_OK, err
    assert 0.4 < time.monotonic() - started < 15  # the grace was given, then SIGKILL
    assert wait_gone([info["pid"], *info["children"]], timeout=10) == []
    exits = [r for r in journal_events(state) if r["event"] == "child.exit"]
    assert [r["returncode"] for r in exits] == [-signal.SIGKILL]


@pytest.mark.parametrize(
    ("rule_id", "pattern"),
    [("backref", r"(a+)\1"), ("huge-repeat", "((a{1000}){1000}){1000}"),
     ("lookahead", "(?=a)(a+)+$")],
)
def test_rule_pack_with_a_catastrophic_or_invalid_pattern_is_rejected(
        tmp_path: Path, pack: Path, guard: Guard, rule_id: str, pattern: str) -> None:
    pack.write_text(PACK_TEXT + f"\n[[rules]]\nid = {json.dumps(rule_id)}\n"
                    f"pattern = '{pattern}'\naction = \"restart\"\n")
    launcher = Launcher(tmp_path, [[["exit", 0]]])
    code, _, err = finish(guard(guard_toml(tmp_path, launcher, pack), argv_for(free_port())))
    assert code == EXIT_USAGE
    assert f"rules[{rule_id}].pattern" in err
    assert "Traceback" not in err
    assert launcher.argvs() == []  # nothing was launched


def test_unwritable_state_dir_is_reported_and_output_still_flows(
        tmp_path: Path, pack: Path, guard: Guard) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # a file where the state dir's parent should be: even root fails
    launcher = Launcher(tmp_path, [[["print", "stdout", "hello from sglang"], ["exit", 1]]])
    proc = guard(guard_toml(tmp_path, launcher, pack), argv_for(free_port()),
                 state_dir=blocker / "state")
    code, out, err = finish(proc)
    assert "state dir is not writable" in err
    assert "hello from sglang" in out
    assert code == EXIT_GIVE_UP, err  # the crash loop, not an internal error


def test_busy_port_at_start_exits_75_with_a_clear_message(
        tmp_path: Path, pack: Path, guard: Guard) -> None:
    launcher = Launcher(tmp_path, [[["exit", 0]]])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = finish(guard(guard_toml(tmp_path, launcher, pack), argv_for(port)))
    assert code == EXIT_GIVE_UP
    assert f"port {port} on 127.0.0.1 is in use" in err
    assert launcher.argvs() == []
    records = journal_events(tmp_path / "state")
    give_up = next(r for r in records if r["event"] == "give_up")
    assert str(port) in give_up["reason"]
    assert give_up["cause"] == "port_busy"  # the metrics' label, not read from the message


def test_sighup_rereads_the_rule_packs_and_keeps_the_old_on_error(
        tmp_path: Path, pack: Path, guard: Guard) -> None:
    launcher = Launcher(tmp_path, [ready_then_wait()])
    state = tmp_path / "state"
    with HealthServer() as server:
        proc = guard(guard_toml(tmp_path, launcher, pack), argv_for(server.port))
        wait_for(lambda: count(state, "ready") >= 1, what="ready")
        pack.write_text(PACK_TEXT + '\n[[rules]]\nid = "broken"\npattern = "(a"\n'
                        'action = "restart"\n')
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: count(state, "reload.rejected") >= 1, what="reload.rejected")
        pack.write_text(PACK_TEXT)
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: count(state, "reload.applied") >= 1, what="reload.applied")
        proc.send_signal(signal.SIGINT)
        code, _, err = finish(proc)
    assert code == EXIT_OK, err
    records = journal_events(state)
    rejected = next(r for r in records if r["event"] == "reload.rejected")
    assert "rules[broken].pattern" in rejected["error"]
    assert [r["event"] for r in records].count("child.start") == 1  # the child kept running
