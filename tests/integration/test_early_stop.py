"""Issue 24: a reader's early stop, with real processes (supervise/shell/child.py).

A fake child writes a line and then waits for SIGTERM. With the loop caught up (nothing on
the queue unstepped) and `stops_at` saying the loop would stop it, the reader sends the tree
its SIGTERM before anything takes the line off the queue; the loop's own `terminate` then
takes that stop over. Where the answer is no, or an event waits unstepped, the child is left
alone. The machine's side (that `stops_at` says what the steps do) is tests/unit/
test_early_stop.py; the whole guard on a real child, tests/integration/test_supervisor.py."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sglang_guard.supervise.events import ChildExited, ChildLine, Tick
from sglang_guard.supervise.shell.eventqueue import EventQueue
from sglang_guard.supervise.shell.proctree import finish_stop
from support.children import next_line

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
