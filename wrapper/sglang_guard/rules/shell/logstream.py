"""A saved log read as a stream of lines: bounded memory whatever the input, devices refused.

`for line in file` keeps a whole line in memory: one 300 MB line costs 300 MB (and more while
it is cut), and `/dev/zero` never ends one. Here a line keeps at most `cap` bytes (the rest
is skipped up to its newline, as the supervisor matches only a line's first LINE_CAP bytes),
and the input must be a regular file, a pipe/FIFO, or a terminal.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Iterator

from sglang_guard.errors import InputError

CHUNK = 1 << 20


def _check_kind(fd: int, name: str) -> None:
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd):
        return
    kind = ("a directory" if stat.S_ISDIR(mode) else
            "a character device" if stat.S_ISCHR(mode) else
            "a block device" if stat.S_ISBLK(mode) else "not a regular file")
    raise InputError(f"cannot read {name}: it is {kind}, not a log file")


def _chunks(fd: int) -> Iterator[bytes]:
    while chunk := os.read(fd, CHUNK):
        yield chunk


def bounded_lines(chunks: Iterator[bytes], cap: int) -> Iterator[bytes]:
    """Lines of the byte stream (without their newline), each cut to at most `cap` bytes."""
    part = bytearray()
    for chunk in chunks:
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            end = len(chunk) if nl < 0 else nl
            room = cap - len(part)
            if room > 0:  # past the cap, the rest of the line is skipped, never kept
                part += chunk[start:start + min(room, end - start)]
            if nl < 0:
                break
            yield bytes(part)
            part.clear()
            start = nl + 1
    if part:
        yield bytes(part)


def log_lines(logfile: str, cap: int) -> Iterator[bytes]:
    """The lines of `logfile` (`-`: stdin), each cut to `cap` bytes; InputError when unreadable."""
    if logfile == "-":
        stdin = sys.stdin.buffer
        with contextlib.suppress(OSError, ValueError):  # no fd: a test's in-memory stdin
            _check_kind(stdin.fileno(), "stdin")
        yield from bounded_lines(iter(lambda: stdin.read(CHUNK), b""), cap)
        return
    try:
        fd = os.open(logfile, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"cannot read {logfile}: {exc.strerror}") from None
    try:
        _check_kind(fd, logfile)
        os.set_blocking(fd, True)
        try:
            yield from bounded_lines(_chunks(fd), cap)
        except OSError as exc:
            raise InputError(f"cannot read {logfile}: {exc.strerror}") from None
    finally:
        os.close(fd)
