"""Which lines of a stream are SGLang's own output, and which exception lines end a traceback.

Python prints a failure as "Traceback (most recent call last):", indented frames, then the
exception line at column 0 ("ValueError: ..."), then the rest of its message. SGLang's
processes print theirs the same way, alone or inside a record ("[...] Scheduler hit an
exception: Traceback (most recent call last):"). C++, CUDA, NCCL and Triton code writes to
the same stderr without SGLang's prefix ("Failed: Cuda error ...custom_all_reduce.cuh:307
'peer access is not supported ...'"), before, between and after SGLang's records.

What a client sent reaches the log only through SGLang's request logging: a record whose
message starts "Receive:", "Receive OpenAI:", "Finish:" or is a JSON request event
(rules/logline.is_request), with the request's text inside repr or JSON quotes, which no
rule matches into (rules/rules.py, QUOTE_LEAD). A request record that ends inside an open
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
from collections.abc import Sequence
from functools import lru_cache

from sglang_guard.common.record import record
from sglang_guard.rules import linescan
from sglang_guard.rules.blockscan import FirstLine
from sglang_guard.rules.logline import (
    clean,
    is_exception_line,
    is_record,
    is_request,
    quotes_closed,
)
from sglang_guard.rules.quick import Quick, may_keep

HEADER = "Traceback (most recent call last):"
UNKNOWN, OTHER, REQUEST, TRACEBACK, MESSAGE = "unknown", "other", "request", "traceback", "message"
STATES = (UNKNOWN, OTHER, REQUEST, TRACEBACK, MESSAGE)  # as rules/_linescan.c numbers them
_STATE_NUMBER = {state: i for i, state in enumerate(STATES)}
# A record's start in bytes (as logline.is_record reads it: srt/utils/common.py:2630), where
# `advance` looks for the last record of a span (then read as `is_record` reads it).
_RECORD_AT = re.compile(rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


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


# --- moving the state over lines nobody reads, exactly -----------------------------------
# `advance` finds the lines that can move the state with a byte regex that is a superset
# (a candidate), then confirms each with `step` on the line as the reader cleans it: what
# `step` would do line by line, at C speed between the few candidates: rules/_linescan.c
# (rules/linescan.py) answers exactly what these regexes answer, where it is built; else
# Hyperscan's superset below, else the regexes themselves. A blank line is one
# whose cleaned head `str.strip()` empties: ASCII whitespace, \x1c-\x1f and the Unicode
# spaces (their UTF-8 bytes are in the class below); a line longer than the cap is blank when
# its first `cap` bytes are.
_SPACEISH = rb"[\t\x0b\x0c\r\x1c-\x20\x80-\xbf\xc2\xe1-\xe3]"
# A request record, as `is_request` reads one: the record's first "] ", then the pattern.
_MAYBE_REQUEST = rb"\[\d{4}-[^\]\n]*\] (?:Receive|Finish: |\{\"event)"
# An exception line (logline.EXCEPTION_PATTERN) in bytes: every bound dropped, and a word
# character may be any non-ASCII byte (a Unicode letter there); the line's CRs are stripped
# by `clean`. (Exact for a cap of 4 KiB or more: the pattern matches at most ~720
# characters, so a cut head cannot end inside its class name.)
_MAYBE_EXCEPTION = (rb"(?:- )?(?:[A-Za-z_][\w\x80-\xff]*\.)*[A-Z][A-Z0-9_]*[a-z][\w\x80-\xff]*"
                    rb"(?::|\r*$)")


@record
class _Candidates:
    """Per cap, the lines that may end a traceback's frames, end a message, or be blank:
    each as a pattern to match at a line's start (`at`) and one to search for after a
    newline (`after`: its literal first byte lets the regex engine skip ahead fast)."""

    frames: tuple[re.Pattern[bytes], re.Pattern[bytes]]
    message: tuple[re.Pattern[bytes], re.Pattern[bytes]]
    blank: tuple[re.Pattern[bytes], re.Pattern[bytes]]


# Without the C: the frames' candidates on Hyperscan (rules/blockscan.FirstLine), for a cap
# of 4 KiB or more:
# an exception line, a request record, a blank line, and a line with a run of 4,096 blank
# bytes (which stands for "a head of as many blank bytes as the cap"; unanchored, a superset,
# it costs the set next to nothing where `^` before it costs a third of the scan). The
# request record is widened to its literal words (a superset of _MAYBE_REQUEST that scans
# ~30% faster). Every candidate is then read by `step`: a superset only costs that.
_FAST_CAP = 4096
_FRAMES_FAST = FirstLine([
    rb"^(?:" + _MAYBE_EXCEPTION + rb")",
    rb"^\[\d{4}-[^\]\n]*\] (?:Receive|Finish|\{)",
    rb"^" + _SPACEISH + rb"*$",
    _SPACEISH + rb"{" + str(_FAST_CAP).encode() + rb"}",
])


def prepare(cap: int) -> None:
    """Compile (or load) the frames' Hyperscan set and the candidates' regexes now, not in
    a reader thread at the first traceback (rules/rules.Matcher.prepare_scan calls it)."""
    _candidates(cap)
    if linescan.first_line is None and _FRAMES_FAST.compile():  # C needs neither
        _FRAMES_FAST.start(b"x\n", 0, 2)  # its pages touched: the first real scan is warm


def warm_thread() -> None:
    """The calling thread's scratch space for the frames' set, if compiled (`prepare`)."""
    _FRAMES_FAST.warm()


@lru_cache(maxsize=4)
def _candidates(cap: int) -> _Candidates:
    blank = rb"(?:" + _SPACEISH + rb"*$|" + _SPACEISH + rb"{" + str(cap).encode() + rb",})"

    def both(body: bytes) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
        return re.compile(rb"(?m)(?:" + body + rb")"), re.compile(rb"(?m)\n(?:" + body + rb")")

    return _Candidates(frames=both(_MAYBE_EXCEPTION + rb"|" + _MAYBE_REQUEST + rb"|" + blank),
                       message=both(rb"\[\d{4}-|" + blank), blank=both(blank))


def _next_line(patterns: tuple[re.Pattern[bytes], re.Pattern[bytes]], block: bytes,
               start: int, end: int) -> int:
    """Where the first line of `block[start:end]` (whole lines) that `patterns` take starts
    (-1: none)."""
    at, after = patterns
    if at.match(block, start, end - 1):
        return start
    found = after.search(block, start, end - 1)
    return -1 if found is None else found.start() + 1


def _first_line(kind: int, block: bytes, span: tuple[int, int], cap: int) -> int:
    """`_next_line` of the frames', the message's or the blank lines' candidates
    (linescan.FRAMES, MESSAGE, BLANK) over `block[start:end]`: in C where built
    (rules/linescan.py, the same answer), else on Hyperscan (the frames, a superset) or the
    regexes."""
    start, end = span
    if linescan.first_line is not None:
        return linescan.first_line(block, start, end, kind, cap)
    line = _FRAMES_FAST.start(block, start, end) if (
        kind == linescan.FRAMES and cap >= _FAST_CAP) else None
    if line is None:
        candidates = _candidates(cap)
        patterns = {linescan.FRAMES: candidates.frames, linescan.MESSAGE: candidates.message,
                    linescan.BLANK: candidates.blank}[kind]
        line = _next_line(patterns, block, start, end)
    return line


def _line_at(block: bytes, start: int, end: int, cap: int) -> tuple[int, str]:
    """The end (its newline) and the cleaned head of the line at `start`."""
    stop = block.find(b"\n", start, end)
    return stop, clean(block[start:min(stop, start + cap)], cap)


def advance(state: str, block: bytes, span: tuple[int, int], cap: int,
            exceptions: list[tuple[int, int, str]], *, reads: Sequence[int] = ()) -> str:
    """The state after the complete lines `block[start:end]` (`span`; `end` just past a
    newline),
    as `step` would leave it reading each line cleaned to `cap` bytes.

    None of these lines is a traceback's header (the reader's scan reports every line that
    holds one, and every line with an ESC or NUL byte, and reads those itself), except the
    lines in `reads` (each by the offset just past its newline, ascending): those are read,
    cleaned and stepped, wherever the walk stands (the reader passes the lines only a
    header hit: `_advance_reading`). The exception lines that end a traceback's frames are
    added to `exceptions` as (start, end, text): the machine sees each even when no rule
    matches it.
    """
    walk = linescan.advance
    if walk is not None:  # in C (rules/_linescan.c), unless a line it must step is not ASCII
        done = walk(_STATE_NUMBER[state], block, span[0], span[1], cap, reads)
        if done is not None:
            after, found = done
            exceptions += found
            return STATES[after]
    if reads:
        return _advance_reading(state, block, span, cap, exceptions, reads=reads)
    return _advance(state, block, span, cap, exceptions)


def _advance_reading(state: str, block: bytes, span: tuple[int, int], cap: int,
                     exceptions: list[tuple[int, int, str]], *, reads: Sequence[int]) -> str:
    """`advance` with lines to read on the way (its definition): the walk to each, then the
    line as the reader reads one (rules/linereader.LineReader._read)."""
    start, end = span
    for stop in reads:
        line = block.rfind(b"\n", start, stop - 1) + 1 or start
        state = advance(state, block, (start, line), cap, exceptions)
        newline, text = _line_at(block, line, stop, cap)
        before = state
        state, _ = step(before, text)
        if ends_frames(before, state):
            exceptions.append((line, newline, text))
        start = stop
    return advance(state, block, (start, end), cap, exceptions)


# A checked line the walk stepped (`read_walk`): its start, its text's length (-1: the quick
# no turned it away), the states before and after it, `step`'s second answer, and its text
# where that is not block[line:line + size] (None): a head of ASCII with an ESC or a NUL,
# cleaned (logline.clean).
Stepped = tuple[int, int, str, str, bool, str | None]


def read_walk(state: str, block: bytes, span: tuple[int, int], cap: int,
              exceptions: list[tuple[int, int, str]], *, reads: Sequence[int],
              checks: Sequence[int], quick: Quick | None = None
              ) -> tuple[str, list[Stepped]] | None:
    """`advance` with `reads`, that also steps each line ending just before an offset of
    `checks` (ascending, none in `reads`: the lines the reader checks) and answers it as a
    `Stepped`, in C (rules/_linescan.c; `_read_walk` is the definition). A checked line whose
    head is ASCII but holds an ESC or a NUL (a colored record) is cleaned and stepped on the
    walk too, and answered with its cleaned text, unless it is the exception line that ends
    a traceback. A checked line whose head is not ASCII, or is such an exception line, ends
    the walk at its start: fewer steps than `checks`, and the state there (the reader reads
    that line itself). None: no C here, or a line the walk must step is not plain ASCII
    (walk it in Python).

    `quick`: a checked plain line rules/quick.may_keep says no to is answered with size -1
    (never a cleaned one: the scan's rules for it are not known, Hits.dirty)."""
    walk = linescan.read_walk
    if walk is None:
        return None
    done = walk(_STATE_NUMBER[state], block, span[0], span[1], cap, reads, checks,
                None if quick is None else quick.literals)
    if done is None:
        return None
    after, found, steps = done
    exceptions += found
    return STATES[after], [(line, size, STATES[before], STATES[then], own, text)
                           for line, size, before, then, own, text in steps]


def _plain(head: bytes) -> bool:
    """Whether cleaning a line whose head is `head` is taking the head (less trailing CRs)."""
    return head.isascii() and b"\x1b" not in head and b"\x00" not in head


def _read_walk(state: str, block: bytes, span: tuple[int, int], cap: int,
               exceptions: list[tuple[int, int, str]], *, reads: Sequence[int],
               checks: Sequence[int], quick: Quick | None = None
               ) -> tuple[str, list[Stepped]]:
    """`read_walk` in Python: its definition (where the C answers at all)."""
    start, end = span
    steps: list[Stepped] = []
    wanted = set(checks)
    for stop in sorted([*reads, *checks]):
        line = block.rfind(b"\n", start, stop - 1) + 1 or start
        state = advance(state, block, (start, line), cap, exceptions)
        head = block[line:min(stop - 1, line + cap)]
        if stop in wanted and not _plain(head):
            if not head.isascii():
                return state, steps
            cleaned = clean(head, cap)  # an ESC or a NUL: its cleaned text is read
            then, own = step(state, cleaned)
            if ends_frames(state, then):  # the exception line: read by the reader itself
                return state, steps
            steps.append((line, len(cleaned), state, then, own, cleaned))
            state, start = then, stop
            continue
        newline, text = _line_at(block, line, stop, cap)
        before = state
        state, own = step(before, text)
        if ends_frames(before, state):
            exceptions.append((line, newline, text))
        if stop in wanted:
            kept = quick is None or may_keep(text, own, quick)
            steps.append((line, len(text) if kept else -1, before, state, own, None))
        start = stop
    return advance(state, block, (start, end), cap, exceptions), steps


def _advance(state: str, block: bytes, span: tuple[int, int], cap: int,
             exceptions: list[tuple[int, int, str]]) -> str:
    """`advance` in Python: its definition, which rules/_linescan.c's answers equal."""
    start, end = span
    while start < end:
        if state not in (TRACEBACK, MESSAGE):
            return _after_last_record(state, block, (start, end), cap, exceptions)
        kind = linescan.FRAMES if state == TRACEBACK else linescan.MESSAGE
        line = _first_line(kind, block, (start, end), cap)
        if line < 0:
            return state
        stop, text = _line_at(block, line, end, cap)
        before = state
        state, _ = step(state, text)
        if ends_frames(before, state):
            exceptions.append((line, stop, text))
        start = stop + 1
    return state


def _after_last_record(state: str, block: bytes, span: tuple[int, int], cap: int,
                       exceptions: list[tuple[int, int, str]]) -> str:
    """`advance` outside a traceback and a message: the last record decides (a request's
    with an open quote, or not); without one, a blank line ends an unknown start."""
    start, end = span
    at = end - 1
    while at > start:
        nl = block.rfind(b"\n[", start, at)
        line = nl + 1 if nl >= 0 else start
        if _RECORD_AT.match(block, line):
            stop, text = _line_at(block, line, end, cap)
            if is_record(text):
                after, _ = step(state, text)
                return _advance(after, block, (stop + 1, end), cap, exceptions)
        if nl < 0:
            break
        at = nl
    while state == UNKNOWN and start < end:
        line = _first_line(linescan.BLANK, block, (start, end), cap)
        if line < 0:
            break
        stop, text = _line_at(block, line, end, cap)
        if not text.strip():
            return OTHER
        start = stop + 1
    return state
