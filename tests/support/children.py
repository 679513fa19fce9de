"""The fake child (tests/fakechild.py) run directly, and the sinks and readers around it."""

from __future__ import annotations

import hashlib
import io
import json
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglang_guard.supervise.events import ChildExited, ChildLine, Event

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

