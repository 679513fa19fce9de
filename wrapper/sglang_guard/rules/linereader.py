"""A stream of chunks read as lines, where only the lines a scan hits are read at all.

The reader threads of supervise/shell/child.py hand every chunk of the child's output to a
`LineReader`. With a scan (`find`: the offsets just past the newline of each line that one
of the current phase's patterns might match in, a superset: rules/rules.Matcher.line_scan),
a chunk costs that scan and little else: only the lines a hit ends in, and those with an
ESC or NUL byte (found by memchr), are cleaned (rules/logline.clean), stepped through the
traceback tracker (rules/tracebacks.step) and checked by `keep` (the exact per-line
matcher); between them the tracker's state moves over the unread lines at C speed
(rules/tracebacks.advance), and the exception line that ends a traceback is read wherever
it is. Where the C is built, one walk per chunk (rules/tracebacks.read_walk) also steps the
checked lines whose head is ASCII (a colored one cleaned there), so that Python only cuts
their text and asks `keep`;
with the scan's quick no (rules/quick.py, past the start: `Hits.quick`, where `keep` checks
with the matcher that scanned) the walk also turns away the lines that only quote a fatal
message, and Python asks nothing of them. A hit costs the lines it is in, not the chunk.

The last exception line that ended a traceback is kept (`last_exception`, with a ticket
that orders it against another stream's reader); it is returned as a line only when `keep`
takes it: a log full of tracebacks costs no line, and no event, per traceback.

Without a scan every line is read and returned (tests, a child with no rules). Either way a
line keeps at most `cap` bytes for matching and `Line.length` counts the whole line's bytes
without its newline; a chunk may end anywhere, even inside a UTF-8 character.

What must hold, and tests/unit/test_reading_paths.py shows over stored logs, mutations and
random chunkings and line soups: the lines returned are exactly those of a full per-line
pass that the machine acts on, and `last_exception` is that pass's last exception line, so
they decide what it decides.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import field
from typing import NamedTuple

from sglang_guard.common.record import record
from sglang_guard.rules import tracebacks
from sglang_guard.rules.logline import clean
from sglang_guard.rules.quick import Quick


class Hits(NamedTuple):
    """What the scan of one block found: the lines (by the offset just past each one's
    newline; unsorted, perhaps repeated; a superset) that a pattern might match in."""

    lines: Iterable[int]  # a rule's (or the ready line's): read and checked by `keep`
    headers: Iterable[int] = ()  # a traceback's header: read by the tracker, not checked
    stage: str | None = None  # the start-up stage of the block's last stage marker, if any
    # Per line (by its end), the rules whose pattern might match in it: every line a rule
    # might match in has its entry (a superset); None: not known. `keep` reads it (Line.maybe).
    rules: Mapping[int, Collection[int]] | None = None
    by: object = None  # whose rules `rules` numbers (rules/rules.Matcher: one reload's)
    # The lines with an ESC or NUL byte (by their ends, as `_dirty` finds them), where the
    # scan found them (past the start in C: rules/rules.Matcher.line_scan) or
    # `LineReader.scan` did after it (None: `feed` looks for them).
    dirty: AbstractSet[int] | None = None
    # The quick no for the lines `rules` names (rules/quick.py), where `by`'s exact check
    # (rules/rules.Matcher.any_of) could take none that it turns away; None: none.
    quick: Quick | None = None


Find = Callable[[bytes], Hits]


@record(eq=False)
class LiteralScan:
    """A scan the pumps' reader runs in C on the bytes it reads, in the same call
    (rules/linescan.read_scan): the set of plain literals it searches (their lines, and those
    with an ESC or a NUL), and what `Find` answers from the pairs it found. One per matcher
    and phase: whoever hands it out hands out the same object while it holds."""

    needles: Sequence[bytes]
    hits: Callable[[list[tuple[int, int]]], Hits]
_HEADER = tracebacks.HEADER.encode()


@record
class Line:
    """One line as the machine gets it (supervise/events.ChildLine without gen and stream)."""

    text: str  # cleaned, its head only
    length: int  # the raw line's full length in bytes
    ends: bool  # it is SGLang's own output to read (rules/tracebacks.step)
    exception: bool  # the exception line that ends a traceback's frames
    # The rules the scan says might match in it (Hits.rules; None: not known), for `keep`
    # only: the machine does not get it.
    maybe: Collection[int] | None = field(default=None, compare=False)
    maybe_by: object = field(default=None, compare=False)  # Hits.by


class LineReader:
    """One stream's lines (`feed` each chunk in order, then `close`)."""

    def __init__(self, cap: int, find: Find | None = None,
                 keep: Callable[[Line], bool] | None = None,
                 ticket: Callable[[], int] | None = None,
                 on_stage: Callable[[str], None] | None = None, *,
                 quick: Callable[[Hits], Quick | None] | None = None) -> None:
        """`find`: the scan (None: every line is read); `keep`: which read lines to return
        (None: all); `ticket`: numbers the exception lines in the order read, shared by the
        readers of one process's two streams (None: this reader's own count); `on_stage`:
        told each stage a scan finds, in stream order, before the lines after it return;
        `quick`: given a chunk's hits, the quick no (rules/quick.py) whose no `keep` would
        answer too for every line they name, if there is one (None: ask `keep`)."""
        self._cap, self._find, self._keep, self._on_stage = cap, find, keep, on_stage
        self._quick = quick
        self._ticket = ticket or itertools.count(1).__next__
        self.state = tracebacks.UNKNOWN
        # The last exception line that ended a traceback (its cleaned head), and its ticket.
        self.last_exception: str | None = None
        self.exception_ticket = 0
        self._head = bytearray()  # the first `cap` bytes of the unfinished line
        self._length = 0  # its full length so far

    def scan(self, chunk: bytes) -> Hits | None:
        """`find(chunk)`, and the lines with an ESC or NUL byte, which `feed(chunk, hits)`
        then reads: any thread may scan, and hand the chunk on to the one that feeds (the
        child's pumps scan on the reader: supervise/shell/child.py). None:
        nothing to scan (no `find`, or no line ends here)."""
        if self._find is None or (last := chunk.rfind(b"\n")) < 0:
            return None
        hits = self._find(chunk)  # with them where its scan found them (in C: Hits.dirty)
        return hits if hits.dirty is not None else hits._replace(dirty=_dirty(chunk, last))

    def feed(self, chunk: bytes, hits: Hits | None = None) -> list[Line]:
        """The lines `chunk` completes that are returned (see the module's docstring).

        `hits`: `scan(chunk)`, when the caller scanned it already (None: scanned here)."""
        out: list[Line] = []
        last = chunk.rfind(b"\n")
        if last < 0:
            self._extend(chunk, 0, len(chunk))
            return out
        if self._find is None:
            self._every_line(chunk, out)
        else:
            self._hit_lines(chunk, last, self._find, out,
                            self._find(chunk) if hits is None else hits)
        self._extend(chunk, last + 1, len(chunk))
        return out

    def close(self) -> list[Line]:
        """The last line, if the stream ended without its newline."""
        out: list[Line] = []
        if self._head or self._length:
            self._read(bytes(self._head), self._length, out)
        self._head.clear()
        self._length = 0
        return out

    # -- the two ways ------------------------------------------------------------------------

    def _every_line(self, chunk: bytes, out: list[Line]) -> None:
        start = 0
        while (newline := chunk.find(b"\n", start)) >= 0:
            raw, length = self._finish(chunk, start, newline)
            self._read(raw, length, out)
            start = newline + 1

    def _hit_lines(self, chunk: bytes, last: int, find: Find, out: list[Line], hits: Hits
                   ) -> None:
        # Lines a rule may read, and those with an ESC or NUL (only their cleaned text says
        # what they hold), are checked by `keep`; a line only a header hit is only stepped.
        dirty = _dirty(chunk, last) if hits.dirty is None else hits.dirty
        checked = {e for e in hits.lines if e <= last + 1} | dirty
        ends = sorted(checked.union(e for e in hits.headers if e <= last + 1))
        first = chunk.find(b"\n")
        pos = 0
        if self._head or self._length:
            # The line the last chunk left unfinished: scanned whole (its head and its end).
            raw, length = self._finish(chunk, 0, first)
            whole = find(raw + b"\n")
            self._stage(whole.stage)  # a marker line cut by the chunk's start
            cut_dirty = bool(_dirty(raw, len(raw))) or first + 1 in dirty
            check = first + 1 in checked or any(True for _ in whole.lines) or cut_dirty
            if check or (ends and ends[0] == first + 1) or any(True for _ in whole.headers):
                self._read(raw, length, out, check,
                           maybe=None if cut_dirty or whole.rules is None
                           else whole.rules.get(len(raw) + 1, ()), by=whole.by)
            else:
                self._skip(raw + b"\n", 0, len(raw) + 1, out)
            pos = first + 1
        self._stage(hits.stage)
        # A line only a header hit is read on the walk to the next checked line (in C: a chunk
        # of many tracebacks costs one call), unless every read line is returned (no `keep`).
        batch = self._keep is not None
        if self._keep is not None:  # in C, the checked lines stepped on that walk too
            pos = self._walk(chunk, (pos, last + 1), [e for e in ends if e > pos],
                             checked=checked, hits=hits, dirty=dirty, keep=self._keep, out=out)
        reads: list[int] = []
        for end in ends:
            if end <= pos:
                continue
            if batch and end not in checked:
                reads.append(end)
                continue
            start = chunk.rfind(b"\n", pos, end - 1) + 1 or pos
            self._skip(chunk, pos, start, out, reads)
            reads = []
            self._read(chunk[start:min(end - 1, start + self._cap)], end - 1 - start, out,
                       end in checked, maybe=_maybe(hits, dirty, end), by=hits.by)
            pos = end
        self._skip(chunk, pos, last + 1, out, reads)

    def _walk(self, chunk: bytes, span: tuple[int, int], ends: list[int], *,
              checked: set[int], hits: Hits, dirty: AbstractSet[int], keep: Callable[[Line], bool],
              out: list[Line]) -> int:
        """Read `chunk[pos:end]` (`span`) on one walk in C (tracebacks.read_walk): the lines
        ending just before `ends` (ascending) are stepped on it, the `checked` ones then
        asked of `keep` (all `keep` is left to do); a checked line C does not step (its
        head not ASCII, or a colored exception line) is read here and the walk goes on past
        it. Where the lines read so far end: `end`, or less where C could not walk (the
        caller's loop reads the rest)."""
        pos, last_end = span
        checks = [e for e in ends if e in checked]
        reads = [e for e in ends if e not in checked]
        # The quick no, for lines whose rules the scan named (in C only ASCII lines, never
        # one with an ESC or a NUL: their `maybe` is known).
        quick = (None if self._quick is None or hits.rules is None or not checks
                 else self._quick(hits))
        while checks or reads:
            found: list[tuple[int, int, str]] = []
            done = tracebacks.read_walk(self.state, chunk, (pos, last_end), self._cap, found,
                                        reads=reads, checks=checks, quick=quick)
            if done is None:
                return pos
            self.state, steps = done
            if found:  # only the last one counts (no rule reads the unchecked ones)
                self._exception(found[-1][2])
            for (line, size, before, after, own, text), end in zip(steps, checks,
                                                                    strict=False):
                if size < 0:  # the quick no: `keep` would not take it
                    continue
                maybe = _maybe(hits, dirty, end)
                taken = Line(chunk[line:line + size].decode("ascii") if text is None else text,
                             end - 1 - line, own, tracebacks.ends_frames(before, after), maybe,
                             None if maybe is None else hits.by)
                if keep(taken):
                    out.append(taken)
            if len(steps) == len(checks):
                return last_end
            end = checks[len(steps)]  # not stepped in C: read here, then walk on past it
            start = chunk.rfind(b"\n", pos, end - 1) + 1 or pos
            self._read(chunk[start:min(end - 1, start + self._cap)], end - 1 - start, out,
                       maybe=_maybe(hits, dirty, end), by=hits.by)
            pos = end
            checks = checks[len(steps) + 1:]
            reads = reads[bisect.bisect_right(reads, end):]
        self._skip(chunk, pos, last_end, out)
        return last_end

    # -- pieces ------------------------------------------------------------------------------

    def _finish(self, chunk: bytes, start: int, newline: int) -> tuple[bytes, int]:
        """The raw head and full length of the line that ends at `chunk[newline]`."""
        if not self._head and not self._length:
            return chunk[start:min(newline, start + self._cap)], newline - start
        room = max(0, self._cap - len(self._head))
        raw = bytes(self._head) + chunk[start:start + min(room, newline - start)]
        length = self._length + newline - start
        self._head.clear()
        self._length = 0
        return raw, length

    def _extend(self, chunk: bytes, start: int, end: int) -> None:
        """Keep the unfinished line's head (a 100 MB line costs `cap` bytes here)."""
        room = self._cap - len(self._head)
        if room > 0:
            self._head += chunk[start:min(end, start + room)]
        self._length += end - start

    def _read(self, raw: bytes, length: int, out: list[Line], check: bool = True, *,
              maybe: Collection[int] | None = None, by: object = None) -> None:
        """Step the tracker over one line; return it if `keep` takes it (`check`: a scan
        says some rule might read it; else `keep` could not take it and is not asked;
        `maybe`: which rules, numbered by `by`: Line.maybe)."""
        if not check and self._keep is not None and raw == _HEADER:
            # The bare header line, the common case: what `step` does with it, at once.
            self.state = (tracebacks.REQUEST if self.state == tracebacks.REQUEST
                          else tracebacks.TRACEBACK)
            return
        text = clean(raw, self._cap)
        before = self.state
        self.state, ends = tracebacks.step(before, text)
        line = Line(text, length, ends, tracebacks.ends_frames(before, self.state), maybe,
                    None if maybe is None else by)
        if line.exception:
            self._exception(text)
        if self._keep is None or (check and self._keep(line)):
            out.append(line)

    def _stage(self, stage: str | None) -> None:
        if stage is not None and self._on_stage is not None:
            self._on_stage(stage)

    def _exception(self, text: str) -> None:
        self.last_exception, self.exception_ticket = text, self._ticket()

    def _skip(self, block: bytes, start: int, end: int, out: list[Line],
              reads: Sequence[int] = ()) -> None:
        """Move the state over `block[start:end]`, whose lines no scan hit but those that end
        just before an offset in `reads` (only a header hit them: read, not checked; only
        with a `keep`, which could not take them)."""
        if end <= start:
            return
        found: list[tuple[int, int, str]] = []
        self.state = tracebacks.advance(self.state, block, (start, end), self._cap, found,
                                        reads=reads)
        if found:  # no scan hit these lines: no rule reads them, only the last one counts
            self._exception(found[-1][2])
        if self._keep is None:
            out += [Line(text, stop - at, True, True) for at, stop, text in found]


def _maybe(hits: Hits, dirty: AbstractSet[int], end: int) -> Collection[int] | None:
    """The rules the scan says might match in the line ending before `end` (Line.maybe); None
    where not known: no per-line answer, or the line has an ESC or NUL (its cleaned text is
    not what the scan read)."""
    return None if hits.rules is None or end in dirty else hits.rules.get(end, ())


def _dirty(block: bytes, end: int) -> set[int]:
    """The ends (just past the newline) of the lines of `block[:end]` that hold an ESC or a
    NUL byte: such a line is read, since only its cleaned text says what it is."""
    found: set[int] = set()
    for byte in (b"\x1b", b"\x00"):
        at = block.find(byte, 0, end)
        while at >= 0:
            newline = block.find(b"\n", at)
            found.add(newline + 1 if newline >= 0 else len(block) + 1)
            if newline < 0:
                break
            at = block.find(byte, newline + 1, end)
    return found
