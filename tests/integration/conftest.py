"""Fixtures for tests with real processes: the fake child, sinks, waits that never sleep."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import queue
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from sglang_guard.core.events import ChildExited, ChildLine, Event
from sglang_guard.shell.child import Child

FAKE = Path(__file__).resolve().parent.parent / "fakechild.py"


def fake_argv(*steps: list[Any]) -> list[str]:
    """The command line of a fake child running `steps`."""
    return [sys.executable, str(FAKE), json.dumps(list(steps))]


class HashSink(io.RawIOBase):
    """A binary sink that keeps a length and a SHA-256, not the bytes (for 100 MB)."""

    def __init__(self) -> None:
        self.size = 0
        self.sha = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.sha.update(data)
        self.size += len(data)
        return len(data)


class BlockingSink(io.BytesIO):
    """A sink whose every write waits until `release` is set: the slowest terminal there is."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def write(self, data: Any) -> int:
        self.entered.set()
        if not self.release.wait(60):
            raise OSError("sink never released")
        return super().write(data)


def collect(events: queue.Queue[Event], timeout: float = 20) -> tuple[list[ChildLine], ChildExited]:
    """Events up to and including the ChildExited (which must come within `timeout`)."""
    deadline = time.monotonic() + timeout
    lines: list[ChildLine] = []
    while True:
        event = events.get(timeout=max(0.0, deadline - time.monotonic()))
        if isinstance(event, ChildExited):
            return lines, event
        assert isinstance(event, ChildLine)
        lines.append(event)


def next_line(
    events: queue.Queue[Event], want: Callable[[ChildLine], bool], timeout: float = 20
) -> ChildLine:
    """The next ChildLine that `want` accepts; fails on ChildExited or timeout."""
    deadline = time.monotonic() + timeout
    while True:
        event = events.get(timeout=max(0.0, deadline - time.monotonic()))
        assert isinstance(event, ChildLine), f"child ended early: {event}"
        if want(event):
            return event


def wait_gone(pids: list[int], timeout: float = 10) -> list[int]:
    """Wait (on pidfds, no sleeping) until every pid has exited; returns the ones still alive.

    A zombie counts as gone: reaping it is its parent's business (PID 1 for orphans).
    """
    fds: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds[os.pidfd_open(pid)] = pid
    try:
        deadline = time.monotonic() + timeout
        while fds:
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            left = deadline - time.monotonic()
            ready = poller.poll(max(0.0, left) * 1000)
            for fd, _ in ready:
                os.close(fd)
                del fds[fd]
            if not ready and left <= 0:
                break
        return sorted(fds.values())
    finally:
        for fd in fds:
            os.close(fd)


def read_pidfile(path: Path) -> dict[str, Any]:
    """The JSON a fake child wrote with ["pidfile", path]."""
    info: dict[str, Any] = json.loads(path.read_text())
    return info


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves a thread running (after giving each 5 s to finish)."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before]
    for thread in leaked:
        thread.join(5)
    alive = [t.name for t in leaked if t.is_alive()]
    assert not alive, f"leaked threads: {alive}"


@pytest.fixture
def events() -> queue.Queue[Event]:
    """The event queue a Child puts on."""
    return queue.Queue()


@pytest.fixture
def spawn(events: queue.Queue[Event]) -> Iterator[Callable[..., Child]]:
    """Spawn fake children (BytesIO sinks unless given); stops whatever is left at the end."""
    children: list[Child] = []

    def start(*steps: list[Any], **kwargs: Any) -> Child:
        kwargs.setdefault("stdout_sink", io.BytesIO())
        kwargs.setdefault("stderr_sink", io.BytesIO())
        child = Child.spawn(fake_argv(*steps), gen=kwargs.pop("gen", 1), events=events, **kwargs)
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None or not child.join(0):
            child.stop(0.0, timeout=10)


@pytest.fixture
def pidfile(tmp_path: Path) -> Iterator[Path]:
    """A path for ["pidfile", ...]; every fake process it names is killed afterwards."""
    path = tmp_path / "pids.json"
    yield path
    if not path.exists():
        return
    info = read_pidfile(path)
    for pid in [info["pid"], *info["children"]]:
        with contextlib.suppress(psutil.Error):
            if str(FAKE) in psutil.Process(pid).cmdline():
                os.kill(pid, signal.SIGKILL)
