"""Many log lines at once: which patterns might match somewhere in them (a superset test).

The reader threads ask this of every chunk the child writes (up to 1 MiB), so it bounds the
guard's pass-through. RE2 reads about 0.6 GB/s on one core of the 2-core bench machine
whatever the pattern set (bench/README.md); Hyperscan (Intel's multi-pattern engine, here
as the Vectorscan fork the `hyperscan` wheel links statically) finds the same patterns'
literal factors with SIMD first and reads the same chunks at several GB/s.

Only the answer "no pattern can match here" is acted on (the chunk is then passed through
with no per-line work); a hit sends the chunk's lines to the exact per-line RE2 matching
(rules/rules.Matcher.candidates). So this test may over-report, never under-report:
- Hyperscan compiles every pattern in its prefilter mode (HS_FLAG_PREFILTER), which by its
  contract reports a superset of the pattern's matches where it must approximate a construct.
- Hyperscan reads bytes, RE2 reads UTF-8 characters: a bounded repeat `{m,n}` of a class
  counts bytes there and characters here, so a line of multi-byte characters could exceed
  `n` bytes within `n` characters. Every upper bound is therefore dropped (`widen`):
  `{m,n}` and `{m}` become `{m,}` (at least m characters are at least m bytes).
- Case folding is ASCII there, Unicode in RE2 (`(?i)k` also matches KELVIN SIGN): no pack
  pattern relies on a non-ASCII fold; `tests/unit/test_blockscan.py` holds both engines to
  the same answers on every stored log and rule example.
- A pattern that Hyperscan cannot take (an anchor behind a lead, say) is scanned by RE2,
  alone; the others stay on Hyperscan.
Where the wheel is missing (a platform it does not build for) or the CPU lacks what it
needs, the whole set is one RE2 set: the same answers, at RE2's speed. `BlockScan.engine`
and `.why` say which; `sglang-guard run` logs `scan.engine` when any pattern is on RE2.

Compiling a Hyperscan database takes ~0.5 s and leaves ~4.5 MiB in the process; loading a
serialized one takes milliseconds and ~1.6 MiB. With a `DatabaseStore` set (`use_store`:
`sglang-guard run` sets rules/shell/scancache.py's), a database is looked up by a digest of
exactly what it is compiled from (the expressions, their ids, the flags, the Hyperscan
version, the CPU), compiled only on a miss and then saved; a stored database that does not
deserialize, or cannot allocate scratch space here, is compiled again as if it were missing.
With a builder as well, a miss is first handed to it (the shell compiles in a short-lived
process, so that the compile's heap never stays in the supervisor), then loaded.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from typing import Any, Protocol

import re2

from sglang_guard.common.record import record
from sglang_guard.common.sha import sha256
from sglang_guard.rules import linescan
from sglang_guard.rules.rulepack import RE2_OPTIONS

_hs: Any
try:  # an optional accelerator: the guard is correct without it
    import hyperscan as _hs
except ImportError:  # pragma: no cover - the wheel exists for the CI platform
    _hs = None


class DatabaseStore(Protocol):
    """Serialized Hyperscan databases kept between processes, by key (rules/shell/scancache.py)."""

    def load(self, key: str) -> bytes | None:
        """The bytes saved under `key`, or None (missing or unusable)."""

    def save(self, key: str, blob: bytes) -> None:
        """Keep `blob` under `key` (failing quietly: a store only saves time)."""


Builder = Callable[[tuple[str, ...], bool], None]
_store: DatabaseStore | None = None
_builder: Builder | None = None


def use_store(store: DatabaseStore | None, build: Builder | None = None) -> None:
    """Load and save compiled databases through `store` from now on (None: compile each).

    `build(patterns, lines)`, when given, is asked first on a miss: it is to leave the
    databases of `BlockScan(patterns, lines=lines)` in the store (a failure is not an error:
    the compile happens here).
    """
    global _store, _builder
    _store, _builder = store, build
    _compile.cache_clear()


def _tokens(pattern: str) -> Iterator[tuple[str, str]]:
    """`pattern` as (kind, text) pieces: "escape", "class", "repeat" ({m,n}) or "char"."""
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        j = i + 1
        if c == "\\":
            j = i + 2
            if pattern[i + 1 : i + 2] in ("x", "p", "P") and pattern[j : j + 1] == "{":
                j = pattern.find("}", j) + 1 or n
            yield "escape", pattern[i:j]
        elif c == "[":
            if pattern[j : j + 1] == "^":
                j += 1
            if pattern[j : j + 1] == "]":  # a leading ] is a literal
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            j += 1
            yield "class", pattern[i:j]
        elif c == "{" and (found := _REPEAT.match(pattern, i)):
            j = found.end()
            yield "repeat", found.group(0)
        else:
            yield "char", c
        i = j


_REPEAT = re.compile(r"\{\d+(?:,\d*)?\}")  # what RE2 reads as a repeat; "{,3}", "{a}" are text


def widen(pattern: str) -> str:
    """`pattern` with each bounded repeat's upper bound dropped: `{m,n}`/`{m}` become `{m,}`.

    Escapes (`\\{`, `\\x{41}`, `\\p{Greek}`) and character classes are copied as they are.
    """
    return "".join(text[: text.find(",")] + ",}" if kind == "repeat" and "," in text
                   else text[:-1] + ",}" if kind == "repeat" else text
                   for kind, text in _tokens(pattern))


def unanchored(pattern: str) -> str:
    """`pattern` without its anchors (`^`, `$`, `\\A`, `\\z`): it then matches anywhere, a superset.

    For a rule's pattern put behind a block lead, where Hyperscan takes no embedded anchor.
    """
    return "".join("" if (kind == "char" and text in "^$")
                   or (kind == "escape" and text in ("\\A", "\\z")) else text
                   for kind, text in _tokens(pattern))


# What a pattern becomes in a per-line set (`BlockScan(lines=True)`): the rest of its line,
# up to and with the newline, so that Hyperscan reports a hit once per line, at its end.
_TO_LINE_END = r"[^\n]*\n"


def line_expression(pattern: str, *, to_line_end: bool = True) -> str:
    """`pattern` as a per-line Hyperscan set holds it: widened (`widen`), cut before its
    first top-level `.*` (`line_prefix`), run on to its line's end (`to_line_end=False`:
    without that tail, as bench/hyperscan_sets.py also times it)."""
    head = widen(line_prefix(pattern))
    return f"(?:{head}){_TO_LINE_END}" if to_line_end else head


# Bytes that end a log's "key: value" and "a, b" pieces everywhere: a literal that ends in
# them ("Scheduler hit an exception: ") makes Hyperscan's literal matcher, which keys on a
# literal's last bytes, stop to confirm at every ": " of the log. Without them the rule
# pack's running set scans ~30% faster (bench/README.md, "The log path, eighth round").
_SEPARATORS = frozenset(" :,;=")


def line_superset(pattern: str) -> str:
    """A rule's pattern as a per-line scan looks for it: `line_prefix`, then
    `trim_separators`. Per line a superset, so only for a pattern whose every hit is checked
    again exactly (a rule's: rules/rules.Matcher); a stage marker's hit is taken as found."""
    return trim_separators(line_prefix(pattern))


def trim_separators(pattern: str) -> str:
    """`pattern` without the run of separator characters (space, `:`, `,`, `;`, `=`, bare or
    escaped) it ends in, where a letter or digit comes before them: a line it matches in
    holds a match of what is left, so per line this is a superset. Anything else at the end
    (a quantifier, a class, a group, an anchor) leaves the pattern as it is."""
    tokens = list(_tokens(pattern))
    n = len(tokens)
    while n and _separator(*tokens[n - 1]):
        n -= 1
    if n == len(tokens) or not n or not (tokens[n - 1][0] == "char"
                                         and tokens[n - 1][1].isalnum()):
        return pattern
    return "".join(text for _, text in tokens[:n])


def _separator(kind: str, text: str) -> bool:
    """Whether a token is one separator character: bare (`:`) or escaped (`\\:`)."""
    return (kind == "char" or (kind == "escape" and len(text) == 2)) and text[-1] in _SEPARATORS


def line_prefix(pattern: str) -> str:
    """`pattern` cut before its first top-level `.*` or `.+` (when it has no top-level `|`):
    a line it matches in holds a match of the part before, so per line this is a superset
    (and Hyperscan need not track the `.*` to the line's end)."""
    depth, cut, tokens = 0, None, list(_tokens(pattern))
    for n, (kind, text) in enumerate(tokens):
        if kind != "char":
            continue
        if text == "(":
            depth += 1
        elif text == ")":
            depth -= 1
        elif depth == 0 and text == "|":
            return pattern
        elif (depth == 0 and text == "." and cut is None and n + 1 < len(tokens)
              and tokens[n + 1] in (("char", "*"), ("char", "+")) and n > 0):
            cut = n
    if cut is None:
        return pattern
    return "".join(text for _, text in tokens[:cut])


class BlockScan:
    """One compiled set of patterns; `hits(block)` names those that might match in it.

    `lines=True`: a per-line set, asked with `line_ends(block)`: which lines of the block
    (by the offset just past their newline) a pattern might match in, each pattern once per
    line; a hit then costs the lines it is in, not the block.
    """

    def __init__(self, patterns: Sequence[str], *, accelerate: bool = True,
                 lines: bool = False) -> None:
        """Keep `patterns` (RE2 syntax); they are compiled on first use (`compile`)."""
        self.patterns = tuple(patterns)
        self.size = len(self.patterns)
        self.lines = lines
        self._accelerate = accelerate
        self._compiled: _Compiled | None = None
        self._lock = threading.Lock()
        self._local = threading.local()  # Hyperscan scratch space is one per scanning thread

    @property
    def engine(self) -> str:
        """Which engine `hits` uses (compiling first): "hyperscan", "hyperscan+re2", "re2", or
        "literals" (a per-line set of plain literals, found in C: linescan.literal_lines)."""
        done = self.compile()
        if done.literals is not None:
            return "literals"
        if done.db is None:
            return "re2"
        return "hyperscan+re2" if done.rest_ids else "hyperscan"

    @property
    def literals(self) -> tuple[bytes, ...] | None:
        """Each pattern's line prefix as its bytes, where the set is searched as plain
        literals (`engine` "literals", compiling first); else None."""
        return self.compile().literals

    @property
    def why(self) -> str | None:
        """Why some or all patterns are scanned by RE2 (None: none are)."""
        return self.compile().why

    @property
    def compiled(self) -> bool:
        """Whether `compile` ran (this compiles nothing)."""
        return self._compiled is not None

    def compile(self) -> _Compiled:
        """Compile now (a Hyperscan set takes ~0.3 s): the supervisor does, before it spawns.

        Commands that never scan a block (`check`, `explain`) never pay for it. Compiled sets
        are shared within the process, keyed by the patterns.
        """
        done = self._compiled
        if done is None:
            with self._lock:
                done = self._compiled
                if done is None:
                    done = self._compiled = _compile(self.patterns, self._accelerate,
                                                     self.lines)
        return done

    @property
    def marks(self) -> bool:
        """Whether `line_ends(block, marks=True)` also answers the lines with an ESC or a NUL
        (the set is searched as literals in C; compiling first)."""
        return self.compile().literals is not None and linescan.literal_lines is not None

    def line_ends(self, block: bytes | memoryview, *, marks: bool = False
                  ) -> list[tuple[int, int]]:
        """(pattern index, offset just past the newline) of each complete line of `block` in
        which that pattern might match (a superset; a per-line set: `lines=True`), unsorted.
        With `marks` where the set is searched in C (`marks`), also (-1, end) for each
        complete line with an ESC or a NUL byte (rules/linereader._dirty's lines), found in
        the same call without the GIL; else `marks` adds nothing.

        A line's own match is a match in the block's bytes ending in that line, so Hyperscan
        reports the line; the patterns on RE2 are found by halving the block at a newline
        until one line is left (a few set scans per hit, none for a block without one).
        """
        if not self.size:
            return []
        done = self.compile()
        if done.literals is not None and linescan.literal_lines is not None:
            return linescan.literal_lines(block, done.literals, 3, marks)
        found: list[tuple[int, int]] = []
        if done.rest_sets:
            data = bytes(block)
            _bisect(done, data, 0, data.rfind(b"\n") + 1, found)
        if done.db is None:
            return found
        scratch = _scratch(self._local, done.db)

        def on_match(pid: int, _start: int, end: int, _flags: int, _ctx: object) -> bool:
            found.append((pid, end))
            return False

        done.db.scan(block, match_event_handler=on_match, scratch=scratch)
        return found

    def hits(self, block: bytes) -> list[int]:
        """Indices of the patterns that might match somewhere in `block` (a superset)."""
        if not self.size:
            return []
        done = self.compile()
        if done.literals is not None and linescan.literal_lines is not None:
            # a match holds no newline: one after the block completes its last line
            return sorted({i for i, _ in linescan.literal_lines(bytes(block) + b"\n",
                                                                 done.literals, 3, False)})
        found: list[int] = []
        if done.rest_sets:
            text = utf8(block)
            found += [done.rest_ids[first + i] for first, part in done.rest_sets
                      for i in part.Match(text) or ()]
        if done.db is None:
            return found
        scratch = _scratch(self._local, done.db)

        def on_match(pid: int, _start: int, _end: int, _flags: int, _ctx: object) -> bool:
            found.append(pid)
            return False  # go on: every pattern reports once (HS_FLAG_SINGLEMATCH)

        done.db.scan(block, match_event_handler=on_match, scratch=scratch)
        return found


def _scratch(local: threading.local, db: Any) -> Any:
    """This thread's Hyperscan scratch space for `db` (one per scanning thread)."""
    scratch = getattr(local, "scratch", None)
    if scratch is None:
        scratch = local.scratch = _hs.Scratch(db)
    return scratch


def utf8(block: bytes) -> bytes:
    """`block` as RE2 reads it the way the per-line matcher does: an invalid UTF-8 byte (which
    RE2 simply fails to match across) becomes U+FFFD, as `logline.clean` decodes it. Costs one
    `isascii` on the common case; Hyperscan reads bytes and needs none of this."""
    if block.isascii():
        return block
    try:
        block.decode("utf-8")
    except UnicodeDecodeError:
        return block.decode("utf-8", "replace").encode("utf-8")
    return block


def _bisect(done: _Compiled, data: bytes, start: int, end: int,
            found: list[tuple[int, int]]) -> None:
    """The lines of `data[start:end]` (whole lines) that the RE2 sets hit, into `found`."""
    if end <= start:
        return
    text = utf8(data[start:end])
    ids = [done.rest_ids[first + i] for first, part in done.rest_sets
           for i in part.Match(text) or ()]
    if not ids:
        return
    middle = data.rfind(b"\n", start, start + (end - start) // 2) + 1
    if middle <= start:  # one line left (or a first line past the middle)
        middle = data.find(b"\n", start, end - 1) + 1
        if middle <= start:
            found += [(i, end) for i in ids]
            return
    _bisect(done, data, start, middle, found)
    _bisect(done, data, middle, end, found)


@record
class _Compiled:
    """A Hyperscan database of the patterns it takes, RE2 sets of the rest."""

    db: Any  # None: no pattern is on Hyperscan
    rest_ids: tuple[int, ...]  # the patterns on RE2
    rest_sets: tuple[tuple[int, Any], ...]  # RE2 sets over them: (index into rest_ids, set)
    why: str | None  # why some or all patterns are on RE2
    # A per-line set of plain literals only: each pattern's bytes, found in C
    # (linescan.literal_lines) instead of on Hyperscan or RE2 (db None, no rest).
    literals: tuple[bytes, ...] | None = None


def _on_re2(patterns: tuple[str, ...], ids: Sequence[int], db: Any, why: str | None,
            lines: bool = False) -> _Compiled:
    rest = tuple(ids)
    # Per line, RE2 reads each line alone: a pattern's `^`/`$` may then stay multi-line.
    sets = _re2_sets(tuple(f"(?m){patterns[i]}" if lines else patterns[i] for i in rest)
                     ) if rest else ()
    return _Compiled(db, rest, sets, why)


@lru_cache(maxsize=16)
def _compile(patterns: tuple[str, ...], accelerate: bool, lines: bool = False) -> _Compiled:
    everything = range(len(patterns))
    if accelerate and lines and (literals := _literals(patterns)) is not None:
        return _Compiled(None, (), (), None, literals)
    if not accelerate:
        return _on_re2(patterns, everything, None, "not accelerated (accelerate=False)", lines)
    if _hs is None:
        return _on_re2(patterns, everything, None, "the hyperscan module is not installed",
                       lines)
    found = _hyperscan(patterns, everything, lines=lines)
    if not isinstance(found, str):
        return _Compiled(found, (), (), None)
    # One pattern it cannot take would put them all on RE2: find which, keep the rest.
    taken = [i for i in everything
             if not isinstance(_hyperscan(patterns, [i], stored=False, lines=lines), str)]
    db = _hyperscan(patterns, taken, lines=lines) if taken else found
    if isinstance(db, str):
        return _on_re2(patterns, everything, None, f"Hyperscan: {found}", lines)
    rest = [i for i in everything if i not in set(taken)]
    return _on_re2(patterns, rest, db,
                   f"{len(rest)} of {len(patterns)} patterns are on RE2 (Hyperscan: {found})",
                   lines)


# What RE2 (and Python's re) read as themselves outside a class: printable ASCII but the
# metacharacters; escaped, any ASCII punctuation or the space (`re2.escape`'s output).
_PLAIN = frozenset(chr(c) for c in range(0x20, 0x7F)) - set(".^$*+?()[]{}|\\")
_ESCAPED = frozenset(chr(c) for c in range(0x20, 0x7F) if not chr(c).isalnum())


def literal(pattern: str) -> bytes | None:
    """The bytes `pattern` matches, where it is a plain literal (printable ASCII, any
    metacharacter escaped; `re2.escape` of such text is one), else None. Read conservatively:
    an escape of a letter or digit (`\\d`, `\\x41`), a class, a group or a flag is not one."""
    out = []
    for kind, text in _tokens(pattern):
        if kind == "char" and text in _PLAIN:
            out.append(text)
        elif kind == "escape" and len(text) == 2 and text[1] in _ESCAPED:
            out.append(text[1])
        else:
            return None
    return "".join(out).encode("ascii") if out else None


def _literals(patterns: tuple[str, ...]) -> tuple[bytes, ...] | None:
    """Each pattern's line prefix as literal bytes, where the C search is built and every
    pattern of the set is one (what the per-line Hyperscan set would look for: a pattern cut
    before its `.*`, as `line_expression` cuts it); else None."""
    if linescan.literal_lines is None or not 0 < len(patterns) <= linescan.MAX_NEEDLES:
        return None
    found = tuple(literal(line_prefix(pattern)) for pattern in patterns)
    return None if None in found else found  # type: ignore[return-value]


def _hyperscan(patterns: tuple[str, ...], ids: Sequence[int], *, stored: bool = True,
               lines: bool = False) -> Any:
    """A Hyperscan block-mode database of the patterns at `ids`, or why it cannot be had.

    `stored`: look it up in (and save it to) the process's store, when one is set.
    `lines`: each pattern runs on to its line's end and reports every line (no SINGLEMATCH).
    """
    expressions = [(line_expression(patterns[i]) if lines else widen(patterns[i])).encode()
                   for i in ids]
    base = _hs.HS_FLAG_PREFILTER | (0 if lines else _hs.HS_FLAG_SINGLEMATCH)
    store = _store if stored else None
    key = database_key(expressions, ids, base) if store is not None else ""
    if store is not None:
        loaded = _load(store, key)
        if loaded is None and _builder is not None:
            _builder(patterns, lines)  # builds the whole set's databases elsewhere, then load
            loaded = _load(store, key)
        if loaded is not None:
            return loaded
    db = _compile_hs(expressions, ids, base)
    if store is not None and not isinstance(db, str):
        store.save(key, _hs.dumpb(db))
    return db


def database_key(expressions: Sequence[bytes], ids: Sequence[int], flags: int) -> str:
    """What a compiled database depends on, as a hex digest: the store's key."""
    h = sha256(b"sglang-guard hyperscan block db 1\0")
    for part in (_hs.__version__, str(_hs.HS_MODE_BLOCK), str(flags), _cpu()):
        h.update(part.encode() + b"\0")
    for i, expression in zip(ids, expressions, strict=True):
        h.update(f"{i}:{len(expression)}:".encode() + expression)
    return h.hexdigest()


@lru_cache(maxsize=1)
def _cpu() -> str:
    """The CPU's model and feature flags (a database is built for the CPU it is compiled on)."""
    import platform  # noqa: PLC0415 - only on a store lookup
    from pathlib import Path  # noqa: PLC0415

    seen: list[str] = [platform.machine()]
    try:
        with Path("/proc/cpuinfo").open(encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith(("flags", "model name", "Features")):
                    seen.append(line.strip())
                elif not line.strip() and len(seen) > 1:
                    break  # the first CPU says it
    except OSError:
        pass
    return "\n".join(seen)


def _load(store: DatabaseStore, key: str) -> Any:
    blob = store.load(key)
    return None if blob is None else _deserialize(blob)


def _deserialize(blob: bytes) -> Any:
    """A stored database that loads and can scan here, or None."""
    try:
        db = _hs.loadb(bytes(blob), _hs.HS_MODE_BLOCK)
        _hs.Scratch(db)  # checks the database against this CPU (HS_DB_PLATFORM_ERROR)
    except (_hs.HyperscanError, TypeError, ValueError):
        return None
    return db


def _compile_hs(expressions: Sequence[bytes], ids: Sequence[int], base: int) -> Any:
    error = "no pattern"
    # A pattern that can match the empty string needs ALLOWEMPTY (it then hits every block,
    # still a superset); the set without it scans faster, so that is tried first.
    for flags in (base, base | _hs.HS_FLAG_ALLOWEMPTY):
        try:
            db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
            db.compile(expressions=list(expressions), ids=list(ids),
                       flags=[flags] * len(expressions))
        except _hs.HyperscanError as exc:  # a pattern it cannot take, or a CPU it cannot run on
            error = str(exc) or type(exc).__name__
            continue
        return db
    return error


# The default pack's ~100 patterns behind the quote-aware lead need more than RE2's 8 MiB.
RE2_SET_MEMORY = 64 << 20


@lru_cache(maxsize=8)
def _re2_sets(patterns: tuple[str, ...]) -> tuple[tuple[int, Any], ...]:
    """RE2 sets of `patterns`, as (index of the first, set): one, or halves where too large."""
    options = re2.Options()
    options.log_errors = RE2_OPTIONS.log_errors
    options.max_mem = RE2_SET_MEMORY
    found = re2.Set.SearchSet(options)
    for pattern in patterns:
        found.Add(pattern)
    try:
        found.Compile()
    except re2.error:
        if len(patterns) == 1:
            raise
        half = len(patterns) // 2
        return (*_re2_sets(patterns[:half]),
                *((i + half, part) for i, part in _re2_sets(patterns[half:])))
    return ((0, found),)


class FirstLine:
    """The first line of a span of whole lines that one of `patterns` might match at its
    start (bytes, multi-line `^`): Hyperscan stopping at its first match (a superset, in
    prefilter mode). `start` is None where Hyperscan is missing or takes a pattern not: the
    caller then searches with its own regex."""

    def __init__(self, patterns: Sequence[bytes]) -> None:
        self.patterns = tuple(patterns)
        self._db: Any = None
        self._tried = False
        self._lock = threading.Lock()
        self._local = threading.local()

    def compile(self) -> bool:
        """Compile (or load from the store) now; whether Hyperscan takes the patterns."""
        return self._compiled() is not None

    def warm(self) -> None:
        """This thread's scratch space, if the set is compiled already (compiles nothing)."""
        if self._tried and self._db is not None:
            self._scanner(self._db)

    def _compiled(self) -> Any:
        if not self._tried:
            with self._lock:
                if not self._tried:
                    self._db = _first_line_db(self.patterns)
                    self._tried = True
        return self._db

    def start(self, block: bytes, start: int, end: int) -> int | None:
        """Where the first such line of `block[start:end]` starts (-1: none; None: ask
        someone else). `start` must be a line's start."""
        db = self._compiled()
        if db is None:
            return None
        scratch, found, on_match = self._scanner(db)
        found.clear()
        # A view, not a copy of the span, where the wheel takes one (0.8.1 and later; 0.7.x
        # scans bytes only: bench/hyperscan-builds-latest.txt).
        span = memoryview(block)[start:end] if _takes_views(db, scratch) else block[start:end]
        try:  # noqa: SIM105 - per line that may end a traceback's frames: a with costs ~1 us
            db.scan(span, match_event_handler=on_match, scratch=scratch)
        except _hs.ScanTerminated:
            pass
        if not found:
            return -1
        line = block.rfind(b"\n", start, start + max(found[0] - 1, 0)) + 1 or start
        return line if line < end else -1

    def _scanner(self, db: Any) -> tuple[Any, list[int], Callable[..., bool]]:
        """This thread's scratch space, match list and match handler (made once each)."""
        made = getattr(self._local, "scanner", None)
        if made is None:
            found: list[int] = []

            def on_match(_pid: int, _start: int, at: int, _flags: int, _ctx: object) -> bool:
                found.append(at)
                return True  # the first is all we need

            made = self._local.scanner = (_scratch(self._local, db), found, on_match)
        return made


_VIEWS: list[bool] = []  # whether this hyperscan build scans a memoryview (asked once)


def _takes_views(db: Any, scratch: Any) -> bool:
    """Whether the installed hyperscan scans a memoryview: 0.8.1 and later do; 0.7.x raises
    TypeError ("a bytes-like object is required") for anything but bytes."""
    if not _VIEWS:
        try:
            db.scan(memoryview(b"\n"), match_event_handler=lambda *_: False, scratch=scratch)
        except TypeError:
            _VIEWS.append(False)
        else:
            _VIEWS.append(True)
    return _VIEWS[0]


def _first_line_db(patterns: tuple[bytes, ...]) -> Any:
    """A `FirstLine` database, through the store when one is set (compiled here on a miss:
    a few patterns, and once per CPU and Hyperscan version)."""
    if _hs is None:
        return None
    flags = _hs.HS_FLAG_PREFILTER | _hs.HS_FLAG_MULTILINE | _hs.HS_FLAG_SINGLEMATCH
    ids = range(len(patterns))
    store = _store
    key = database_key(patterns, ids, flags) if store is not None else ""
    if store is not None and (loaded := _load(store, key)) is not None:
        return loaded
    db = _compile_hs(patterns, ids, flags)
    if isinstance(db, str):
        return None
    if store is not None:
        store.save(key, _hs.dumpb(db))
    return db
