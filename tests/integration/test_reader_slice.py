"""Issue 24: each pipe's reader runs on a short time slice while the child runs, and on the
kernel's default once the guard has signalled the child (supervise/shell/child.py,
READER_SLICE_NS; common/shell/timeslice.py). Real processes, the slices read back from the
kernel by each reader's native id; a flood's reads put its reader back on the default
until a quiet one. On a kernel that keeps no per-thread slice (Linux before 6.12) there is
nothing to read back: these tests say so and skip; the unit tests of timeslice.py hold what
happens there."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from sglang_guard.common.shell import timeslice
from sglang_guard.supervise.events import ChildLine
from sglang_guard.supervise.shell.child import READER_SLICE_NS, Child
from sglang_guard.supervise.shell.eventqueue import EventQueue
from support.children import next_line
from support.harness import wait_for

FATAL = "ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90."


@pytest.fixture
def events() -> EventQueue:
    """The supervisor's own queue (the early stop needs it)."""
    return EventQueue()


@pytest.fixture(autouse=True)
def _slices_here() -> None:
    took: list[bool] = []
    probe = threading.Thread(target=lambda: took.append(timeslice.set_slice(READER_SLICE_NS)))
    probe.start()
    probe.join()
    if not took[0]:
        pytest.skip("this kernel keeps no per-thread time slice (Linux before 6.12)")


def _reader_slices(child: Child) -> list[int | None]:
    tids = [pump.reader.native_id for pump in child._pumps]
    assert all(tid is not None for tid in tids)
    return [timeslice.slice_ns(tid) for tid in tids if tid is not None]


def test_the_readers_run_on_the_short_slice_until_the_loop_stops_the_child(spawn, events
                                                                           ) -> None:
    child = spawn(["ignore_term"], ["print", "stdout", "up"], ["print", "stderr", "up"],
                  ["pause"])
    read = {next_line(events, lambda line: True).stream for _ in range(2)}
    assert read == {"stdout", "stderr"}  # both readers have read
    assert _reader_slices(child) == [READER_SLICE_NS, READER_SLICE_NS]
    child.terminate()  # it ignores the SIGTERM: both readers still read
    slices = _reader_slices(child)
    assert READER_SLICE_NS not in slices and None not in slices, slices
    child.stop(0.0, timeout=20)


def test_an_early_stop_puts_the_readers_back_on_the_default_slice(spawn, events) -> None:
    def stops_at(lines: Sequence[ChildLine]) -> bool:
        return any(line.text == FATAL for line in lines)

    # no other line: the early stop needs the loop caught up (every event put before the
    # fatal line's stepped), which no one does here, and the other reader's line could come
    # first whatever the child's order
    child = spawn(["ignore_term"], ["print", "stderr", FATAL], ["pause"], stops_at=stops_at)
    next_line(events, lambda line: line.text == FATAL)  # the stderr reader's early stop
    wait_for(lambda: READER_SLICE_NS not in _reader_slices(child), 20,
             "both readers back on the default slice")
    assert child.poll() is None  # the SIGTERM went out (ignored); the readers read on
    child.stop(0.0, timeout=20)


def test_a_flood_puts_its_reader_on_the_default_slice_and_a_quiet_line_back(
        spawn, events, tmp_path) -> None:
    """A read of QUIET_READ or more (a flood: the child ahead of the guard) puts its reader
    back on the default slice; the next short read, on the short one again."""
    go = tmp_path / "go"
    with Path(os.devnull).open("wb") as sink:  # a plain file: the writer keeps pace in C
        child = spawn(["ignore_term"], ["fill", "stdout", 1 << 30, "x"], ["print", "stdout", ""],
                      ["wait_file", str(go)], ["print", "stdout", "quiet"], ["pause"],
                      stdout_sink=sink)
        reader = child._pumps[0].reader  # stdout's
        wait_for(lambda: reader.native_id is not None
                 and timeslice.slice_ns(reader.native_id) not in (None, READER_SLICE_NS),
                 20, "the flooded reader on the default slice")
        assert next_line(events, lambda line: True, 60).length == 1 << 30  # all of it read
        go.touch()
        assert next_line(events, lambda line: True).text == "quiet"
        assert reader.native_id is not None
        assert timeslice.slice_ns(reader.native_id) == READER_SLICE_NS
        child.stop(0.0, timeout=20)
