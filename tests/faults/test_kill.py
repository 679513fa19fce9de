"""SIGKILL: of the guard mid-run (nothing can run in it), and of SGLang (as the OOM killer would).

What must hold:
- guard SIGKILLed: its child dies with it (parent-death signal); members of the child's tree
  that outlive it are stopped by the next guard on the same state dir before it launches; the
  journal stays readable and the next guard appends to it.
- child SIGKILLed: the guard reports the exit (-9), stops what is left of that tree, restarts
  within the crash-loop limits, and every byte the child wrote before dying is passed through.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import psutil

from sglang_guard.errors import EXIT_OK
from sglang_guard.supervise.machine import READY_LINE
from support.guards import GuardRun, argv_for, guard_toml, leftovers
from support.harness import HealthServer, Launcher, count, journal_events, ready_then_wait, wait_for
from support.procs import wait_gone

Start = type[GuardRun]


def grandchildren(run: GuardRun, n: int) -> list[int]:
    """The pids the fake grandchildren print once they ignore SIGTERM ("gc-ready <pid>")."""
    def ready() -> list[int]:
        found = [int(w.split()[1]) for w in run.stdout_path.read_text().splitlines()
                 if w.startswith("gc-ready ")]
        return found if len(found) >= n else []

    pids: list[int] = wait_for(ready, what=f"{n} grandchildren ready")
    return pids


def _guard_killed_then_restarted(tmp_path: Path, pack: Path, start_guard: Start,
                                 setsid: bool) -> list[int]:
    """Run a tree, SIGKILL the guard, start a new one; the first tree's grandchildren alive."""
    pids = tmp_path / "pids.json"
    launcher = Launcher(tmp_path, [
        [["spawn", 2, setsid], ["pidfile", str(pids)], *ready_then_wait()],
        ready_then_wait(),
    ])
    state = tmp_path / "state"
    with HealthServer() as server:
        config = guard_toml(tmp_path, launcher, pack, max_failures=3, stop_grace_s=0.3)
        argv = argv_for(server.port)
        first = start_guard(tmp_path, config, argv, state)
        wait_for(lambda: count(state, "ready") >= 1, what="first ready")
        main_pid = json.loads(pids.read_text())["pid"]
        kids = grandchildren(first, 2)
        first.proc.kill()
        first.proc.wait(30)
        # The kernel's parent-death signal: the main child goes with the guard, at once.
        assert wait_gone([main_pid], timeout=10) == []
        records = journal_events(state)  # readable, whatever was cut short
        assert [r["event"] for r in records].count("ready") == 1

        second = start_guard(tmp_path / "second", config, argv, state)
        wait_for(lambda: count(state, "ready") >= 2, what="ready after the guard came back")
        alive = wait_gone(kids, timeout=10)
        second.proc.send_signal(signal.SIGTERM)
        code, _, err = second.wait(30)
    assert code == EXIT_OK, err
    assert leftovers(launcher) == alive
    return alive


def test_guard_sigkilled_its_child_dies_and_the_next_guard_stops_the_rest(
        tmp_path: Path, pack: Path, start_guard: Start) -> None:
    alive = _guard_killed_then_restarted(tmp_path, pack, start_guard, setsid=False)
    assert alive == [], "group members of the killed guard's child outlived the next start"
    records = journal_events(tmp_path / "state")
    stopped = [r for r in records if r["event"] == "orphans.stopped"]
    assert len(stopped) == 1
    assert stopped[0]["terminated"] + stopped[0]["killed"] == 2
    # the second guard's events follow the first's in the same, still readable, journal
    events = [r["event"] for r in records]
    assert events.index("orphans.stopped") < len(events) - events[::-1].index("child.start") - 1


def test_guard_sigkilled_a_setsid_grandchild_is_stopped_by_the_next_guard(
        tmp_path: Path, pack: Path, start_guard: Start) -> None:
    alive = _guard_killed_then_restarted(tmp_path, pack, start_guard, setsid=True)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert alive == []


def test_child_sigkilled_is_restarted_and_its_output_kept(
        tmp_path: Path, pack: Path, start_guard: Start) -> None:
    pids = tmp_path / "pids.json"
    launcher = Launcher(tmp_path, [
        [["spawn", 1, False], ["pidfile", str(pids)], ["print", "stdout", "before the OOM kill"],
         *ready_then_wait()],
        ready_then_wait(),
    ])
    state = tmp_path / "state"
    with HealthServer() as server:
        run = start_guard(tmp_path, guard_toml(tmp_path, launcher, pack, max_failures=3,
                                               stop_grace_s=0.3),
                          argv_for(server.port), state)
        wait_for(lambda: count(state, "ready") >= 1, what="first ready")
        kids = grandchildren(run, 1)
        os.kill(json.loads(pids.read_text())["pid"], signal.SIGKILL)
        wait_for(lambda: count(state, "ready") >= 2, what="ready after the restart")
        # the killed child's group member must not outlive its launch (GPU memory, ports)
        assert wait_gone(kids, timeout=10) == []
        run.proc.send_signal(signal.SIGTERM)
        code, raw, err = run.wait(30)
        out = raw.decode()
    assert code == EXIT_OK, err
    assert out.count("before the OOM kill") == 1
    assert out.count(READY_LINE) == 2
    assert "gc-ready" in out  # the grandchild's line, written to the inherited pipe
    records = journal_events(state)
    exits = [r["returncode"] for r in records if r["event"] == "child.exit"]
    assert exits[0] == -signal.SIGKILL
    assert [r["event"] for r in records].count("backoff") == 1  # a crash, within the limits
    assert leftovers(launcher) == []


def test_a_planted_child_record_naming_a_stranger_does_not_get_it_killed(
        tmp_path: Path, pack: Path, start_guard: Start) -> None:
    # A stranger in its own session, and a child.pgid naming it with its true start time:
    # what a SIGKILLed guard's file looks like after pid reuse, or what anyone can plant.
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        started = psutil.Process(stranger.pid).create_time()
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        (state / "child.pgid").write_text(json.dumps(
            {"pgid": stranger.pid, "procs": [[stranger.pid, started]]}))
        launcher = Launcher(tmp_path, [ready_then_wait()])
        with HealthServer() as server:
            run = start_guard(tmp_path, guard_toml(tmp_path, launcher, pack, stop_grace_s=0.3),
                              argv_for(server.port), state)
            wait_for(lambda: count(state, "ready") >= 1, what="ready")
            run.proc.send_signal(signal.SIGTERM)
            code, _, err = run.wait(30)
        assert code == EXIT_OK, err
        assert stranger.poll() is None, "the guard killed a process it never started"
        left = [r for r in journal_events(state) if r["event"] == "orphans.left"]
        assert len(left) == 1, left
        assert "orphans.stopped" not in [r["event"] for r in journal_events(state)]
    finally:
        stranger.kill()
        stranger.wait()
