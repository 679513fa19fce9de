"""The loop's event queue (supervise/shell/eventqueue.py): `put_lines` decides only when the
loop has stepped every event put before, with no event able to come between the decision
and the lines, and acts before the loop is told."""

from __future__ import annotations

import threading

import pytest

from sglang_guard.supervise.events import ChildLine, Event, Tick
from sglang_guard.supervise.shell.eventqueue import EventQueue


def lines(*texts: str) -> list[Event]:
    return [ChildLine(1, "stderr", text, len(text)) for text in texts]


def drain(events: EventQueue) -> list[Event]:
    out = []
    while not events.empty():
        out.append(events.get_nowait())
        events.task_done()
    return out


def test_a_caught_up_loop_lets_the_reader_decide_and_act_before_the_lines_are_taken() -> None:
    events, seen = EventQueue(), []
    events.put_lines(lines("a", "b"), lambda: seen.append("decide") or True,
                     lambda: seen.append(("act", events.qsize())))
    assert seen == ["decide", ("act", 2)]  # the lines are queued when it acts
    assert [e.text for e in drain(events)] == ["a", "b"]  # type: ignore[attr-defined]


def test_an_event_not_yet_stepped_means_no_decision() -> None:
    events, seen = EventQueue(), []
    events.put(Tick("settle", 1))
    events.get_nowait()  # taken, not yet stepped: the loop's state is not the one to read
    events.put_lines(lines("a"), lambda: seen.append("decide") or True, lambda: seen.append("act"))
    assert seen == []
    events.task_done()
    drain(events)
    events.put_lines(lines("b"), lambda: seen.append("decide") or False,
                     lambda: seen.append("act"))
    assert seen == ["decide"]  # caught up now: asked, and the answer was no


def test_no_event_comes_between_the_decision_and_its_lines() -> None:
    events = EventQueue()
    other: list[threading.Thread] = []

    def decide() -> bool:  # another thread puts while the reader decides
        thread = threading.Thread(target=events.put, args=(Tick("settle", 1),))
        thread.start()
        other.append(thread)
        return True

    events.put_lines(lines("a", "b"), decide, lambda: None)
    other[0].join(10)
    assert [type(e).__name__ for e in drain(events)] == ["ChildLine", "ChildLine", "Tick"]


def test_a_decision_that_raises_queues_the_lines_and_does_not_act() -> None:
    events, seen = EventQueue(), []

    def decide() -> bool:
        raise RuntimeError("a bug the loop's own step meets again")

    events.put_lines(lines("a"), decide, lambda: seen.append("act"))
    assert seen == [] and len(drain(events)) == 1


def test_an_act_that_raises_still_leaves_the_lines_for_the_loop() -> None:
    events = EventQueue()

    def act() -> None:
        raise OSError("no such process")

    with pytest.raises(OSError, match="no such process"):
        events.put_lines(lines("a"), lambda: True, act)
    assert len(drain(events)) == 1 and events.unfinished_tasks == 0
