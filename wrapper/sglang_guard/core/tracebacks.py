"""Which exception lines end a Python traceback: the only exception lines a rule may read.

Python prints a failure as "Traceback (most recent call last):", indented frames, then the
exception line at column 0 ("ValueError: ..."), then the rest of its message. SGLang's
processes print theirs the same way, alone or inside a record ("[...] Scheduler hit an
exception: Traceback (most recent call last):"). A column-0 line shaped like an exception
anywhere else -- the second line of a multi-line warning, an exception message that
quotes a request ("...stop string 'x\\nRuntimeError: CUDA out of memory'"), a print --
is not SGLang's error output and must not trigger a rule (issue 12).

The tracker reads a stream's lines in order; its state is one of:
- "unknown": nothing read yet that tells (a log excerpt that starts mid-way, a server's
  output before its first record): an exception-shaped line counts, as it always did;
- "other": outside any traceback;
- "traceback": after a header, in the frames (what other processes print meanwhile, a
  record or a progress bar, may interleave: the first exception-shaped line ends it);
- "message": after the exception line, in the rest of its message (sgl_kernel lists its
  load attempts there as "- ImportError: ..." items, which count too).
A blank line or an SGLang record ends a message. Nothing here can tell a traceback that
a hostile multi-line message forges line by line from a real one; it stops what quoting
or a plain continuation line can do.
"""

from __future__ import annotations

import re

from sglang_guard.core.logline import EXCEPTION_PATTERN, is_exception_line, is_record

HEADER = "Traceback (most recent call last):"
_HEADER_B = HEADER.encode()
UNKNOWN, OTHER, TRACEBACK, MESSAGE = "unknown", "other", "traceback", "message"
# The byte forms `skip` searches with: a blank line, a record's start (as logline.is_record
# reads it: srt/utils/common.py:2630), an exception line (as logline.is_exception_line).
_BLANK = rb"[ \t\r\f\v]*"
_RECORD_START = rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
_RECORD_B = re.compile(rb"(?m)^" + _RECORD_START)
_BLANK_B = re.compile(rb"(?m)^" + _BLANK + rb"\n")
# The lines `step` leaves the frames at (a blank line, an exception line) and a message at
# (a blank line, a record), for `skip` to jump to.
_ENDS_FRAMES_B = re.compile(rb"(?m)^(?:" + _BLANK + rb"$|" + EXCEPTION_PATTERN.encode() + rb")")
_ENDS_MESSAGE_B = re.compile(rb"(?m)^(?:" + _BLANK + rb"$|" + _RECORD_START + rb")")


def step(state: str, line: str) -> tuple[str, bool]:
    """The state after `line`, and whether `line` may be read as an exception line."""
    if line.rstrip().endswith(HEADER):
        return TRACEBACK, False
    blank = not line.strip()
    if state == TRACEBACK:
        if blank:
            return OTHER, False
        if is_exception_line(line):  # the first exception line after the frames
            return MESSAGE, True
        # A frame, or what another process printed meanwhile (a record, a progress bar).
        return TRACEBACK, False
    if state == MESSAGE:
        if blank or is_record(line):
            return OTHER, False
        return MESSAGE, line.startswith("- ")
    if state == UNKNOWN:
        if blank or is_record(line):
            return OTHER, False
        return UNKNOWN, True
    return OTHER, False


def skip(state: str, block: bytes, head: bytes = b"", *, header: bool = True) -> str:
    """The state after `block`'s complete lines, which nobody reads (`head`: the start of the
    line the block continues, if any; an unfinished last line is left for the next block).

    `header=False`: the caller knows the block holds no header (the reader's prefilter,
    core/rules.Matcher.scan, finds them): outside a traceback this is then constant work.
    Inside one, the lines that can move the state (a blank line, an exception line, a
    record) are found by one regex search each, from the last header on: as `step` would
    read the lines one by one, at C speed.
    """
    start = 0
    if head:  # the line the block finishes is read whole, as `step` reads lines
        first = block.find(b"\n")
        if first < 0:
            return state
        state, _ = step(state, (head + block[:first]).decode("utf-8", "replace"))
        start = first + 1
    at = block.rfind(_HEADER_B, start) if header else -1
    if at >= 0:
        state, start = TRACEBACK, block.find(b"\n", at) + 1
        if start == 0:
            return state
    elif state == OTHER:
        return OTHER
    elif state == UNKNOWN:
        return OTHER if (_RECORD_B.search(block, start) or _BLANK_B.search(block, start)) \
            else UNKNOWN
    while state in (TRACEBACK, MESSAGE):
        found = (_ENDS_FRAMES_B if state == TRACEBACK else _ENDS_MESSAGE_B).search(block, start)
        end = -1 if found is None else block.find(b"\n", found.start())
        if found is None or end < 0:  # not before a full line
            return state
        state, _ = step(state, block[found.start():end].decode("utf-8", "replace"))
        start = end + 1
    return state
