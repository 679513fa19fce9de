"""Many log lines at once: which patterns might match somewhere in them (a superset test).

The reader threads ask this of every chunk the child writes (up to 1 MiB), so it bounds the
guard's pass-through. RE2 reads about 0.6 GB/s on one core of the 2-core bench machine
whatever the pattern set (bench/README.md); Hyperscan (Intel's multi-pattern engine, here
as the Vectorscan fork the `hyperscan` wheel links statically) finds the same patterns'
literal factors with SIMD first and reads the same chunks at several GB/s.

Only the answer "no pattern can match here" is acted on (the chunk is then passed through
with no per-line work); a hit sends the chunk's lines to the exact per-line RE2 matching
(core/rules.Matcher.candidates). So this test may over-report, never under-report:
- Hyperscan compiles every pattern in its prefilter mode (HS_FLAG_PREFILTER), which by its
  contract reports a superset of the pattern's matches where it must approximate a construct.
- Hyperscan reads bytes, RE2 reads UTF-8 characters: a bounded repeat `{m,n}` of a class
  counts bytes there and characters here, so a line of multi-byte characters could exceed
  `n` bytes within `n` characters. Every upper bound is therefore dropped (`widen`):
  `{m,n}` and `{m}` become `{m,}` (at least m characters are at least m bytes).
- Case folding is ASCII there, Unicode in RE2 (`(?i)k` also matches KELVIN SIGN): no pack
  pattern relies on a non-ASCII fold; `tests/unit/test_blockscan.py` holds both engines to
  the same answers on every stored log and rule example.
Where the wheel is missing (a platform it does not build for), the CPU lacks what it needs,
or a pattern does not compile there, the whole set falls back to one RE2 set: the same
answers, at RE2's speed (`BlockScan.engine` says which).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import re2

from sglang_guard.core.rulepack import RE2_OPTIONS

_hs: Any
try:  # an optional accelerator: the guard is correct without it
    import hyperscan as _hs
except ImportError:  # pragma: no cover - the wheel exists for the CI platform
    _hs = None


def widen(pattern: str) -> str:
    """`pattern` with each bounded repeat's upper bound dropped: `{m,n}`/`{m}` become `{m,}`.

    Escapes (`\\{`, `\\x{41}`, `\\p{Greek}`) and character classes are copied as they are.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            j = i + 2
            if pattern[i + 1 : i + 2] in ("x", "p", "P") and pattern[j : j + 1] == "{":
                j = pattern.find("}", j) + 1 or n
            out.append(pattern[i:j])
            i = j
        elif c == "[":
            j = i + 1
            if pattern[j : j + 1] == "^":
                j += 1
            if pattern[j : j + 1] == "]":  # a leading ] is a literal
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            out.append(pattern[i : j + 1])
            i = j + 1
        elif c == "{":
            j = i + 1
            while j < n and pattern[j].isdigit():
                j += 1
            low = pattern[i + 1 : j]
            if low and j < n and pattern[j] == ",":
                j += 1
                while j < n and pattern[j].isdigit():
                    j += 1
            if low and j < n and pattern[j] == "}":
                out.append("{" + low + ",}")
                i = j + 1
            else:  # not a repeat: a literal brace, as RE2 reads it
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


class BlockScan:
    """One compiled set of patterns; `hits(block)` names those that might match in it."""

    def __init__(self, patterns: Sequence[str], *, accelerate: bool = True) -> None:
        """Keep `patterns` (RE2 syntax); they are compiled on first use (`compile`)."""
        self.patterns = tuple(patterns)
        self.size = len(self.patterns)
        self._accelerate = accelerate
        self._db: Any = None
        self._sets: tuple[tuple[int, Any], ...] = ()
        self._compiled = False
        self._lock = threading.Lock()
        self._local = threading.local()  # Hyperscan scratch space is one per scanning thread

    @property
    def engine(self) -> str:
        """Which engine `hits` uses (compiling first): "hyperscan" or "re2"."""
        self.compile()
        return "hyperscan" if self._db is not None else "re2"

    def compile(self) -> None:
        """Compile now (a Hyperscan set takes ~0.3 s): the supervisor does, before it spawns.

        Commands that never scan a block (`check`, `explain`) never pay for it. Compiled sets
        are shared within the process, keyed by the patterns.
        """
        if self._compiled or not self.size:
            return
        with self._lock:
            if not self._compiled:
                db = _hyperscan(self.patterns) if self._accelerate else None
                if db is None:
                    self._sets = _re2_sets(self.patterns)
                self._db = db
                self._compiled = True

    def hits(self, block: bytes) -> list[int]:
        """Indices of the patterns that might match somewhere in `block` (a superset)."""
        if not self.size:
            return []
        self.compile()
        if self._db is None:
            return [first + i for first, part in self._sets for i in part.Match(block) or ()]
        found: list[int] = []
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = _hs.Scratch(self._db)

        def on_match(pid: int, _start: int, _end: int, _flags: int, _ctx: object) -> bool:
            found.append(pid)
            return False  # go on: every pattern reports once (HS_FLAG_SINGLEMATCH)

        self._db.scan(block, match_event_handler=on_match, scratch=scratch)
        return found


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


@lru_cache(maxsize=8)
def _hyperscan(patterns: tuple[str, ...]) -> Any:
    """A Hyperscan block-mode database of `patterns`, or None where it cannot be had."""
    if _hs is None:
        return None
    expressions = [widen(p).encode() for p in patterns]
    base = _hs.HS_FLAG_PREFILTER | _hs.HS_FLAG_SINGLEMATCH
    # A pattern that can match the empty string needs ALLOWEMPTY (it then hits every block,
    # still a superset); the set without it scans faster, so that is tried first.
    for flags in (base, base | _hs.HS_FLAG_ALLOWEMPTY):
        try:
            db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
            db.compile(expressions=expressions, ids=list(range(len(patterns))),
                       flags=[flags] * len(patterns))
        except _hs.HyperscanError:  # a pattern it cannot take, or a CPU it does not run on
            continue
        return db
    return None
