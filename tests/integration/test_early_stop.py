"""Issue 24: a reader's early stop, with real processes (supervise/shell/child.py).

A fake child writes a line and then waits for SIGTERM. With the loop caught up (nothing on
the queue unstepped) and `stops_at` saying the loop would stop it, the reader sends the tree
its SIGTERM before anything takes the line off the queue; the loop's own `terminate` then
takes that stop over. Where the answer is no, or an event waits unstepped, the child is left
alone. The machine's side (that `stops_at` says what the steps do) is tests/unit/
test_early_stop.py; the whole guard on a real child, tests/integration/test_supervisor.py."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from sglang_guard.errors import EXIT_OK
from sglang_guard.supervise.events import ChildExited, ChildLine, Tick
from sglang_guard.supervise.shell import child as child_module
from sglang_guard.supervise.shell.eventqueue import EventQueue
from sglang_guard.supervise.shell.proctree import Stopping, finish_stop
from support.children import next_line
from support.guards import Guard, argv_for, finish, guard_toml
from support.harness import (
    HealthServer,
    Launcher,
    base_argv,
    count,
    journal_events,
    make_runtime,
    ready_then_wait,
    supervise,
    terminate_when,
    wait_for,
)
from support.pack import FA3_LINE

FATAL = "ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90."
SCRIPT = (["print", "stderr", FATAL], ["wait_term"], ["print", "stdout", "got-term"],
          ["exit", 3])


@pytest.fixture
def events() -> EventQueue:
    """The supervisor's own queue, which `spawn` (tests/support/fixtures.py) hands the Child."""
    return EventQueue()


def fatal(lines: Sequence[ChildLine]) -> bool:
    return any(line.text == FATAL for line in lines)


def test_the_reader_stops_the_child_before_the_loop_takes_the_line(spawn, events) -> None:
    asked: list[list[str]] = []

    def stops_at(lines: Sequence[ChildLine]) -> bool:
        asked.append([line.text for line in lines])
        return fatal(lines)

    child = spawn(*SCRIPT, stops_at=stops_at)
    assert child.join(20), "the child was never stopped"  # nothing took an event meanwhile
    assert child.poll() == 3 and [FATAL] in asked
    taken = [events.get_nowait() for _ in range(events.qsize())]
    assert [e.text for e in taken if isinstance(e, ChildLine)] == [FATAL, "got-term"]
    assert isinstance(taken[-1], ChildExited)
    first = child.terminate()  # the loop's Stop: the reader's stop, taken over
    again = child.terminate()
    assert again is not first  # taken once; a later one is a new stop
    assert [h.pid for h in first.handles] == [child.pid]
    for stopping in (first, again):
        finish_stop(stopping, 0.0)  # all gone: closes the pidfds


def test_no_early_stop_where_the_loop_would_not_stop(spawn, events) -> None:
    child = spawn(*SCRIPT, stops_at=lambda lines: False)
    next_line(events, lambda line: line.text == FATAL)  # decided before it was queued
    events.task_done()
    assert child.poll() is None
    report = finish_stop(child.terminate(), 20)
    assert report.terminated == 1 and child.join(20) and child.poll() == 3


def test_no_early_stop_while_an_event_waits_to_be_stepped(spawn, events) -> None:
    events.put(Tick("settle", 1))  # on the queue, not stepped: the loop's state may change
    child = spawn(*SCRIPT, stops_at=fatal)
    assert isinstance(events.get(timeout=20), Tick)
    next_line(events, lambda line: line.text == FATAL)
    assert child.poll() is None


def test_an_early_stop_that_fails_leaves_the_reader_reading_and_the_loop_stops_it(
        spawn, events, monkeypatch) -> None:
    """The reader's walk or signal fails (any error: here the one a bad group raises): the
    reader reads on, every line reaches the queue, and the loop's own terminate stops it."""
    real, calls = child_module.terminate_tree, []

    def flaky(pid: int | None, pgid: int) -> Stopping:
        calls.append(pid)
        if len(calls) == 1:
            raise ValueError("refusing to signal process group")
        return real(pid, pgid)

    monkeypatch.setattr(child_module, "terminate_tree", flaky)
    child = spawn(["print", "stderr", FATAL], ["wait_term"], ["print", "stderr", "got-term"],
                  ["exit", 3], stops_at=fatal)  # the same stream after: its reader must live
    next_line(events, lambda line: line.text == FATAL)
    events.task_done()
    assert calls == [child.pid] and child.poll() is None  # tried, failed, child untouched
    report = finish_stop(child.terminate(), 20)
    assert report.terminated == 1 and child.join(20) and child.poll() == 3
    assert next_line(events, lambda line: True).text == "got-term"


def _sent(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once a reader's early stop has signalled the tree (still under the child's stop
    lock: whoever asks `wait_early_end` after it sees that stop)."""
    real, sent = child_module.terminate_tree, threading.Event()

    def terminate_tree(pid: int | None, pgid: int) -> Stopping:
        stopping = real(pid, pgid)
        sent.set()
        return stopping

    monkeypatch.setattr(child_module, "terminate_tree", terminate_tree)
    return sent


def test_the_loop_waits_once_for_an_early_stops_main_process_to_end(
        spawn, events, monkeypatch) -> None:
    """`wait_early_end`, which the loop asks before it steps the lines (child.END_WAIT_S):
    after a reader's early stop it returns once the main process ended (reaped: its status
    is known), and only the first time."""
    sent = _sent(monkeypatch)
    child = spawn(*SCRIPT, stops_at=fatal)
    next_line(events, lambda line: line.text == FATAL)
    assert sent.wait(20)
    assert child.wait_early_end(30) is True and child.poll() == 3
    assert child.wait_early_end(30) is None  # once per stop
    finish_stop(child.terminate(), 0.0)


def test_a_child_that_outlives_its_early_stop_holds_the_loop_no_longer_than_asked(
        spawn, events, monkeypatch) -> None:
    sent = _sent(monkeypatch)
    child = spawn(["ignore_term"], ["print", "stderr", FATAL], ["sleep", 60], ["exit", 0],
                  stops_at=fatal)
    next_line(events, lambda line: line.text == FATAL)
    assert sent.wait(20)
    assert child.wait_early_end(0.05) is False and child.poll() is None
    assert child.wait_early_end(30) is None  # asked once: the loop steps on
    report = finish_stop(child.terminate(), 0.0)  # the reader's stop, taken over: SIGKILL
    assert report.killed == 1 and child.join(20) and child.poll() == -signal.SIGKILL


def test_no_wait_without_an_early_stop(spawn, events) -> None:
    child = spawn(*SCRIPT, stops_at=lambda lines: False)
    next_line(events, lambda line: line.text == FATAL)
    events.task_done()
    assert child.wait_early_end(30) is None and child.poll() is None
    report = finish_stop(child.terminate(), 20)
    assert report.terminated == 1 and child.join(20)


def _waiting_at_eof(thread: threading.Thread) -> bool:
    """Whether `thread` is in Child._let_end (a reader at EOF, waiting for the main
    process's end)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "_let_end":
            return True
        frame = frame.f_back
    return False


def test_a_reader_at_eof_lets_a_stopped_child_end_before_its_pump_ends(
        spawn, events, monkeypatch, tmp_path) -> None:
    """After the guard's SIGTERM, a reader whose pipe closed waits for the main process's
    end (END_WAIT_S, raised here) before it wakes its writer and scanner: the child
    ignores SIGTERM, closes both pipes and lives on until told to exit; the readers wait at
    EOF, and end once the reaper saw the end."""
    monkeypatch.setattr(child_module, "END_WAIT_S", 60.0)
    go = tmp_path / "go"
    child = spawn(["ignore_term"], ["print", "stdout", "ready"], ["wait_file", str(go)],
                  ["close", "stdout"], ["close", "stderr"], ["sleep", 60], ["exit", 0])
    next_line(events, lambda line: line.text == "ready")
    stopping = child.terminate()  # ignored: the child lives on
    go.touch()
    readers = [pump.reader for pump in child._pumps]
    assert wait_for(lambda: all(_waiting_at_eof(r) for r in readers), 20)
    assert child.poll() is None and all(r.is_alive() for r in readers)
    report = finish_stop(stopping, 0.0)  # SIGKILL: the main process ends
    assert report.killed == 1
    assert child.join(20) and not any(r.is_alive() for r in readers)
    assert isinstance(events.get(timeout=20), ChildExited)


def test_a_reader_at_eof_does_not_wait_for_a_child_the_guard_did_not_stop(
        spawn, events, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(child_module, "END_WAIT_S", 60.0)
    child = spawn(["print", "stdout", "ready"], ["close", "stdout"], ["close", "stderr"],
                  ["wait_file", str(tmp_path / "go")], ["exit", 0])
    next_line(events, lambda line: line.text == "ready")
    for pump in child._pumps:
        pump.reader.join(20)
        assert not pump.reader.is_alive()  # ended at EOF, the child still running
    assert child.poll() is None
    (tmp_path / "go").touch()
    assert child.join(20)


def test_the_loop_steps_an_early_stops_lines_once_the_child_ended(
        tmp_path: Path, server: HealthServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the loop (in-process): the reader stops a quiet launch's fa3 line early; the loop
    asks `wait_early_end` before its step, which returns with the main process ended, and
    then fixes as ever."""
    real, answers = child_module.Child.wait_early_end, []

    def wait_early_end(self: child_module.Child, timeout: float) -> bool | None:
        answer = real(self, max(timeout, 30.0))  # this machine may be slow: the order counts
        answers.append((self.gen, answer, self.poll()))
        return answer

    monkeypatch.setattr(child_module.Child, "wait_early_end", wait_early_end)
    launcher = Launcher(tmp_path, [
        [["sleep", 1.0], ["print", "stderr", FA3_LINE], ["wait_term"], ["exit", 1]],
        ready_then_wait(),
    ])
    rt = make_runtime(tmp_path, launcher)
    argv = base_argv(server.port, "--attention-backend", "fa3")
    assert supervise(rt, argv, terminate_when(tmp_path / "state", "ready")) == EXIT_OK
    assert (1, True, 1) in answers, answers  # waited for gen 1's end, which then was known
    assert [a for a in answers if a[1] is not None] == [(1, True, 1)], answers
    assert launcher.argvs()[1] == base_argv(server.port)  # the loop's fix: fa3 dropped


def test_the_guard_stops_a_quiet_child_early_and_still_fixes_and_journals(
        tmp_path: Path, pack: Path, guard: Guard) -> None:
    """`sglang-guard run`: a launch that writes the fa3 line after a quiet second (the loop long
    caught up) and then waits for SIGTERM is stopped by its reader (`child.stop` says early),
    the fix is the loop's as ever, and the fixed launch comes up."""
    launcher = Launcher(tmp_path, [
        [["sleep", 1.0], ["print", "stderr", FA3_LINE], ["wait_term"], ["exit", 1]],
        ready_then_wait(),
    ])
    state = tmp_path / "state"
    with HealthServer() as server:
        argv = argv_for(server.port, "--attention-backend", "fa3")
        proc = guard(guard_toml(tmp_path, launcher, pack, stop_grace_s=5.0), argv)
        wait_for(lambda: count(state, "ready") >= 1, what="ready")
        proc.send_signal(signal.SIGTERM)
        code, _, err = finish(proc)
    assert code == EXIT_OK, err
    stops = [json.loads(line) for line in err.splitlines()
             if line.startswith("{") and '"child.stop"' in line]
    assert [(s["gen"], s["early"]) for s in stops] == [(1, True), (2, False)], stops
    assert launcher.argvs()[1] == argv_for(server.port)  # the loop's fix: fa3 dropped
    rem = next(r for r in journal_events(state) if r["event"] == "remediated")
    assert (rem["rule"], rem["line"]) == ("fa3-sm", FA3_LINE)
