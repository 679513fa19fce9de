"""Which lines of a stream are SGLang's own output, and which exception lines end a traceback.

Python prints a failure as "Traceback (most recent call last):", indented frames, then the
exception line at column 0 ("ValueError: ..."), then the rest of its message. SGLang's
processes print theirs the same way, alone or inside a record ("[...] Scheduler hit an
exception: Traceback (most recent call last):"). C++, CUDA, NCCL and Triton code writes to
the same stderr without SGLang's prefix ("Failed: Cuda error ...custom_all_reduce.cuh:307
'peer access is not supported ...'"), before, between and after SGLang's records.

What a client sent reaches the log only through SGLang's request logging: a record whose
message starts "Receive:", "Receive OpenAI:", "Finish:" or is a JSON request event
(core/logline.is_request), with the request's text inside repr or JSON quotes, which no
rule matches into (core/rules.py, QUOTE_LEAD). A request record that ends inside an open
quote (cut at the line cap, or a text ever printed raw) continues: every line after it up to
the next record is request text by structure, and never read. Everything else is SGLang's
own output.

The tracker reads a stream's lines in order; its state is one of:
- "unknown": nothing read yet that tells (a log excerpt that starts mid-way);
- "other": outside any traceback or request: every non-record line is read;
- "request": after a request record whose quote is still open, in its continuation: no
  line is read;
- "traceback": after a header, in the frames (what other processes print meanwhile, a
  record or a progress bar, may interleave: the first exception-shaped line ends it);
- "message": after the exception line, in the rest of its message (sgl_kernel lists its
  load attempts there as "- ImportError: ..." items, which count too; any other line of the
  message may quote what a request held, and is not read).
A blank line or an SGLang record ends a message. Nothing here can tell a traceback that
a hostile multi-line message forges line by line from a real one; it stops what quoting
or a plain continuation line can do.
"""

from __future__ import annotations

import re

from sglang_guard.core.logline import (
    EXCEPTION_PATTERN,
    REQUEST_PATTERN,
    is_exception_line,
    is_record,
    is_request,
    quotes_closed,
)

HEADER = "Traceback (most recent call last):"
_HEADER_B = HEADER.encode()
UNKNOWN, OTHER, REQUEST, TRACEBACK, MESSAGE = "unknown", "other", "request", "traceback", "message"
# The byte forms `skip` searches with: a blank line, a record's start (as logline.is_record
# reads it: srt/utils/common.py:2630), a request record, an exception line.
_BLANK = rb"[ \t\r\f\v]*"
_RECORD_START = rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
_RECORD_AT = re.compile(_RECORD_START)
_REQUEST_AT = re.compile(_RECORD_START + rb"(?:\.\d{1,9})?(?: [^\]\n]{0,200})?\] "
                         + REQUEST_PATTERN.encode())
_BLANK_B = re.compile(rb"(?m)^" + _BLANK + rb"\n")
# The lines `step` leaves the frames at (a blank line, an exception line, a request record)
# and a message at (a blank line, a record), for `skip` to jump to.
_ENDS_FRAMES_B = re.compile(rb"(?m)^(?:" + _BLANK + rb"$|" + EXCEPTION_PATTERN.encode()
                            + rb"|" + _REQUEST_AT.pattern + rb")")
_ENDS_MESSAGE_B = re.compile(rb"(?m)^(?:" + _BLANK + rb"$|" + _RECORD_START + rb")")


def step(state: str, line: str) -> tuple[str, bool]:
    """The state after `line`, and whether `line` is SGLang's own output to read (an
    exception line that ends a traceback, or any line outside tracebacks and requests)."""
    if is_record(line):
        if is_request(line) and not quotes_closed(line):
            return REQUEST, False  # its text goes on past this line
        if line.rstrip().endswith(HEADER):
            return TRACEBACK, False
        # Another process's record inside a traceback's frames; any other record ends a
        # message, a request's continuation, an unknown start.
        return (TRACEBACK if state == TRACEBACK else OTHER), False
    if state == REQUEST:
        return REQUEST, False  # a request's continuation, whatever it looks like
    if line.rstrip().endswith(HEADER):
        return TRACEBACK, False
    blank = not line.strip()
    if state == TRACEBACK:
        if blank:
            return OTHER, False
        if is_exception_line(line):  # the first exception line after the frames
            return MESSAGE, True
        # A frame, or what another process printed meanwhile (a progress bar).
        return TRACEBACK, False
    if state == MESSAGE:
        if blank:
            return OTHER, False
        return MESSAGE, line.startswith("- ")
    if blank:
        return OTHER, False
    return state, True  # unknown or other: SGLang's own output, a record or not


def ends_frames(before: str, after: str) -> bool:
    """Whether the line that took the stream from `before` to `after` (`step`) is the
    exception line that ends a traceback's frames."""
    return before == TRACEBACK and after == MESSAGE


def _last_record(block: bytes, start: int, end: int) -> int:
    """Where the last record line of `block[start:end]` starts (-1: none)."""
    at = end
    while at > start:
        nl = block.rfind(b"\n[", start, at)
        line = nl + 1 if nl >= 0 else start
        if _RECORD_AT.match(block, line):
            return line
        if nl < 0:
            return -1
        at = nl
    return -1


def _after_records(state: str, block: bytes, start: int, end: int) -> str:
    """The state after `block[start:end]`, which holds no header nor a frame or message line
    that matters: its last record decides (a request's or not); without one, a blank line
    ends an unknown start."""
    last = _last_record(block, start, end)
    if last >= 0:
        if not _REQUEST_AT.match(block, last):
            return OTHER
        stop = block.find(b"\n", last, end)
        line = block[last:stop if stop >= 0 else end].decode("utf-8", "replace")
        return OTHER if quotes_closed(line) else REQUEST
    if state == UNKNOWN and _BLANK_B.search(block, start, end):
        return OTHER
    return state


def skip(state: str, block: bytes, head: bytes = b"", *, header: bool = True) -> str:
    """The state after `block`'s complete lines, which nobody reads (`head`: the start of the
    line the block continues, if any; an unfinished last line is left for the next block).

    `header=False`: the caller knows the block holds no header (the reader's prefilter,
    core/rules.Matcher.scan, finds them): outside a traceback this is then the search for
    the block's last record (from its end, usually one line). Inside one, the lines that can
    move the state (a blank line, an exception line, a record) are found by one regex search
    each, from the last header on: as `step` would read the lines one by one, at C speed.
    """
    start = 0
    if head:  # the line the block finishes is read whole, as `step` reads lines
        first = block.find(b"\n")
        if first < 0:
            return state
        state, _ = step(state, (head + block[:first]).decode("utf-8", "replace"))
        start = first + 1
    end = block.rfind(b"\n") + 1  # complete lines only
    if end <= start:
        return state
    at = block.rfind(_HEADER_B, start, end) if header else -1
    if at >= 0:
        line = block.rfind(b"\n", start, at) + 1
        line = max(line, start)
        after = block.find(b"\n", at) + 1
        # The state just before the header's line: a request's continuation makes it inert.
        before = _after_records(state, block, start, line) if line > start else state
        state, _ = step(before, block[line:after - 1].decode("utf-8", "replace"))
        start = after
    while state in (TRACEBACK, MESSAGE):
        found = (_ENDS_FRAMES_B if state == TRACEBACK else _ENDS_MESSAGE_B).search(block, start,
                                                                                 end)
        stop = -1 if found is None else block.find(b"\n", found.start(), end)
        if found is None or stop < 0:  # not before a full line
            return state
        state, _ = step(state, block[found.start():stop].decode("utf-8", "replace"))
        start = stop + 1
    return _after_records(state, block, start, end)
