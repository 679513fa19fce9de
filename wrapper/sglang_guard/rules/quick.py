"""The quick no: a line a scan hit that no rule of a set of plain literals can take.

Past the start the default pack's scan is a set of plain literals (rules/blockscan.literal:
each running-phase rule's pattern starts with its own), and most lines it hits only quote a
fatal message: a request record, an OpenAI record, an access line, an exception about a
user's stop string (bench/compare/pass_through.py's near-miss mix: ~5,000 such lines per
million, each a Python call and a regex match on the thread that reads lines). What the
exact check (rules/rules.Matcher.any_of) reads of a line is its error text (logline.
error_text), and a rule's pattern must match there at the text's start (a plain record's
message) or at a place outside quotes (rules.QUOTE_LEAD); a pattern that starts with a
literal matches only where that literal starts. So a line where no fatal rule's literal
starts at such a place, and no `present` literal is anywhere (a non-fatal rule's, which
reads the whole line; the ready line, which the supervisor keeps), is one the check turns
away: `may_keep` says so first, in C on the reader's walk (rules/_linescan.c `may_keep`,
tracebacks.read_walk), and the reader asks nothing more of it.

`may_keep` is the definition the C is held to (tests/unit/test_quick.py); that its no is
the check's no over stored logs, near-miss lines and random soups is held there too.
"""

from __future__ import annotations

from collections.abc import Iterator

from sglang_guard.common.record import record
from sglang_guard.rules.logline import error_text

MAX_LITERALS = 16  # a part of `Quick` (rules/_linescan.c MAX_QUICK)


@record
class Quick:
    """What the quick no reads: the fatal rules' literals (each rule's pattern starts with
    its own) and the literals taken wherever they are in the line (non-fatal rules', the
    supervisor's ready line). A scan's hits carry their matcher's (linereader.Hits.quick,
    beside Hits.by): only a chunk that matcher scanned, for its own check, may be turned
    away."""

    fatal: tuple[bytes, ...]
    present: tuple[bytes, ...]

    def __post_init__(self) -> None:
        for part in (self.fatal, self.present):
            if len(part) > MAX_LITERALS or not all(part) or not all(
                    lit.isascii() and b"\n" not in lit for lit in part):
                raise ValueError("Quick: at most 16 non-empty ASCII literals a part, no newline")

    @property
    def literals(self) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
        """(fatal, present), as rules/_linescan.c's read_walk takes them."""
        return self.fatal, self.present


def may_keep(text: str, ends: bool, quick: Quick) -> bool:
    """Whether the exact check might take the line `text` (plain ASCII, cleaned; `ends`: what
    rules/tracebacks.step says of it): False only where it cannot (see the module's
    docstring)."""
    raw = text.encode("ascii")
    if any(lit in raw for lit in quick.present):
        return True
    found = error_text(text, ends)
    if found is None:
        return False
    body, at_start = found
    start = len(raw) - len(body)
    if at_start:
        return raw.startswith(quick.fatal, start)
    return any(raw.startswith(quick.fatal, at) for at in outside_quotes(raw, start))


def outside_quotes(raw: bytes, start: int) -> Iterator[int]:
    """The places of `raw[start:]` that rules.QUOTE_LEAD reaches from `start`: it reads
    unquoted bytes one at a time, a backslash with the byte after it, a quoted string whole
    (to the first unescaped quote like the one that opened it); a quote that does not close
    ends it (RE2 reads `.` as any byte but a newline, and the line holds none)."""
    at, end = start, len(raw)
    while at < end:
        yield at
        byte = raw[at]
        if byte == 0x5C:  # a backslash
            at += 2
            continue
        if byte not in (0x22, 0x27):  # a quote: " or '
            at += 1
            continue
        close = at + 1
        while close < end and raw[close] != byte:
            close += 2 if raw[close] == 0x5C else 1
        if close >= end:
            return
        at = close + 1
