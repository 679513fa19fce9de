"""common/shell/timeslice.py: a thread's slice under the fair scheduler, asked for and read
back from the kernel (Linux 6.12+), its policy and nice value kept, and nothing raised or
changed where the kernel, the machine or the thread's policy does not allow it."""

from __future__ import annotations

import os
import platform
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sglang_guard.common.shell import timeslice


def _in_thread(work: Callable[[], Any]) -> Any:
    """`work()` on a thread of its own (a slice, a nice value or a policy set there ends
    with it, not with the test process's main thread)."""
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(work()))
    thread.start()
    thread.join()
    return got[0]


TAKES = _in_thread(lambda: timeslice.set_slice(timeslice.SHORTEST_NS))
needs_slices = pytest.mark.skipif(not TAKES, reason="this kernel keeps no per-thread slice "
                                                    "(Linux before 6.12), or not Linux")


@pytest.fixture
def no_syscall(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A machine whose syscall numbers the module does not know."""
    timeslice._syscall.cache_clear()
    monkeypatch.setattr(timeslice, "_machine", lambda: "riscv64")
    yield
    timeslice._syscall.cache_clear()


@needs_slices
def test_a_thread_asks_for_a_short_slice_and_back_for_the_default() -> None:
    def work() -> tuple[int | None, bool, int | None, bool, int | None]:
        default = timeslice.slice_ns()
        short = timeslice.set_slice(timeslice.SHORTEST_NS)
        now = timeslice.slice_ns()
        back = timeslice.set_slice(0)
        return default, short, now, back, timeslice.slice_ns()

    default, short, now, back, again = _in_thread(work)
    assert short and now == timeslice.SHORTEST_NS
    assert back and again == default and default != timeslice.SHORTEST_NS


@needs_slices
def test_another_thread_by_its_native_id_and_its_nice_value_kept() -> None:
    ready, done = threading.Event(), threading.Event()

    def worker() -> None:
        os.setpriority(os.PRIO_PROCESS, 0, 7)  # this thread's nice value (Linux: per thread)
        ready.set()
        done.wait(20)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert ready.wait(20) and thread.native_id is not None
        tid = thread.native_id
        assert timeslice.set_slice(3 * timeslice.SHORTEST_NS, tid)
        assert timeslice.slice_ns(tid) == 3 * timeslice.SHORTEST_NS
        assert timeslice.slice_ns() != 3 * timeslice.SHORTEST_NS  # not the caller's
        assert os.getpriority(os.PRIO_PROCESS, tid) == 7
    finally:
        done.set()
        thread.join()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="no SCHED_IDLE here")
def test_a_thread_on_another_policy_is_left_as_it_is() -> None:
    def work() -> tuple[bool, int, int | None]:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return (timeslice.set_slice(timeslice.SHORTEST_NS), os.sched_getscheduler(0),
                timeslice.slice_ns())

    took, policy, read = _in_thread(work)
    assert not took and policy == os.SCHED_IDLE and read is None


def test_the_machine_is_the_kernels() -> None:
    assert timeslice._machine() == platform.machine()


def test_a_machine_without_known_numbers_changes_nothing(no_syscall: None) -> None:
    assert timeslice.set_slice(timeslice.SHORTEST_NS) is False
    assert timeslice.set_slice(0) is False
    assert timeslice.slice_ns() is None


def test_an_id_no_thread_has_is_no_error() -> None:
    # (a thread that ended would do, but its id may be reused at once; this one cannot be)
    assert timeslice.set_slice(timeslice.SHORTEST_NS, 2**31 - 1) is False
    assert timeslice.slice_ns(2**31 - 1) is None
