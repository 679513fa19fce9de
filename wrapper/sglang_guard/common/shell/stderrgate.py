"""One stderr shared by SGLang's lines and the guard's events, without either splitting the other.

SGLang's stderr is passed through byte for byte, in chunks as they are read; a chunk may end
in the middle of a line (a traceback being written, a progress bar). A guard event written
then would land inside that line. Both go through one gate: a child chunk is written whole
under the gate's lock, and a guard event waits (queued, in order) while the child's last chunk
left a line open; it is written right after the chunk that ends that line, or when the guard
exits. (Events are never lost: the journal has them at once; at most MAX_PENDING wait, past
that they are written anyway, so memory stays bounded.)
"""

from __future__ import annotations

import sys
import threading
from typing import BinaryIO, TextIO

MAX_PENDING = 1000


class Gate:
    """Orders the child's stderr bytes and the guard's event lines on one stream."""

    def __init__(self, text: TextIO, raw: BinaryIO) -> None:
        self._text, self._raw = text, raw
        self._lock = threading.Lock()
        self._open = False  # the child's last chunk did not end its line
        self._pending: list[str] = []

    def child_write(self, chunk: bytes) -> None:
        """Pass a child chunk through; then release events that waited for its line to end."""
        with self._lock:
            self._raw.write(chunk)
            self._raw.flush()
            if chunk:
                self._open = not chunk.endswith((b"\n", b"\r"))
            if not self._open:
                self._release()

    def guard_write(self, line: str) -> None:
        """Write one whole event line now, or after the child's open line ends."""
        with self._lock:
            if self._open and len(self._pending) < MAX_PENDING:
                self._pending.append(line)
                return
            self._text.write(line)
            self._text.flush()

    def release(self) -> None:
        """Write whatever waits (the guard is exiting: no child line can go on)."""
        with self._lock:
            self._open = False
            self._release()

    def _release(self) -> None:
        if self._pending:
            self._text.write("".join(self._pending))
            self._text.flush()
            self._pending.clear()


class ChildSink:
    """The binary sink a child's stderr pump writes to (`Runtime.stderr`)."""

    def __init__(self, gate: Gate) -> None:
        self._gate = gate

    def write(self, chunk: bytes) -> int:
        """Write a chunk through the gate."""
        self._gate.child_write(chunk)
        return len(chunk)

    def flush(self) -> None:
        """Chunks are flushed as they are written."""


class GuardStream:
    """The text stream the guard's logger prints to: each complete line goes through the gate."""

    def __init__(self, gate: Gate) -> None:
        self._gate = gate
        self._buf = ""

    def write(self, text: str) -> int:
        """Collect text; every finished line is handed to the gate whole."""
        self._buf += text
        if "\n" in self._buf:
            done, _, self._buf = self._buf.rpartition("\n")
            self._gate.guard_write(done + "\n")
        return len(text)

    def flush(self) -> None:
        """Lines are written as they complete."""

    def isatty(self) -> bool:
        """As the real stderr."""
        return sys.stderr.isatty()


_gate: Gate | None = None


def gate() -> Gate:
    """The process's stderr gate (made on first use, around the real sys.stderr)."""
    global _gate  # noqa: PLW0603 - one stderr per process
    if _gate is None:
        _gate = Gate(sys.stderr, sys.stderr.buffer)
    return _gate


def child_stderr() -> BinaryIO:
    """The sink for SGLang's stderr."""
    return ChildSink(gate())  # type: ignore[return-value]


def guard_stderr() -> TextIO:
    """The stream for the guard's own events."""
    return GuardStream(gate())  # type: ignore[return-value]
