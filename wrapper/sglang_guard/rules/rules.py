"""Log rules at work: which rule a log line triggers, and the flag change that answers it.

`Matcher` compiles every pack's patterns (see `rules/rulepack.py`) into RE2 sets, and
`first_fix` turns a matching line into at most one `Fix` for the current command line.
RE2 matching is linear in the line, so a hostile pattern cannot stall the log pipe.

A rule reads SGLang's own error output only (`rules/logline.error_text`): the text of an
exception line, an error-level record or argparse's error anywhere outside quotes, a plain
SGLang record's message from its start. A logged request, an access line or a quoted string
never triggers one. A rule acts in its phase only (`Rule.phase`: start, running or any).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import cached_property, lru_cache
from typing import Any

import re2
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from sglang_guard.common.outcomes import Advice
from sglang_guard.common.record import record
from sglang_guard.errors import ConfigError
from sglang_guard.rules import linescan, tracebacks
from sglang_guard.rules.blockscan import BlockScan, line_superset, unanchored
from sglang_guard.rules.fixes import FIX_KINDS, Fix, MatchContext
from sglang_guard.rules.linereader import Hits, LiteralScan
from sglang_guard.rules.logline import LINE_CAP, error_text
from sglang_guard.rules.quick import Quick
from sglang_guard.rules.rulepack import (
    RE2_OPTIONS,
    Conditions,
    Rule,
    RulePack,
    compile_pattern,
    load_default_pack,
    load_default_packs,
    parse_pack,
)
from sglang_guard.rules.stages import MARKERS, READY_LINE, last_stage

__all__ = [
    "Conditions",
    "Fix",
    "MatchContext",
    "Matcher",
    "Rule",
    "RulePack",
    "acting",
    "acts",
    "advice_for",
    "advice_record",
    "captures",
    "compile_pattern",
    "first_fix",
    "in_phase",
    "is_catch_all",
    "load_default_pack",
    "load_default_packs",
    "parse_pack",
    "plan_fix",
    "precedence",
    "refired",
]


# --- matching ------------------------------------------------------------------------------

# A match must start outside quotes: the text before it is unquoted characters, escapes and
# whole quoted strings ('...' or "...", as Python's repr writes them). Anchored at the start
# of the text; RE2 keeps it linear.
QUOTE_LEAD = r"""(?:[^'"\\]|\\.|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")*?"""
# What a chunk is scanned for, per line (rules/blockscan.py, `lines=True`): each rule's own
# pattern, widened and unanchored, with no lead (a lead that skips quoted text costs the scan
# most of its speed): a line that quotes a fatal message is a hit, then one exact per-line
# check (`candidates`) in the reader, and no event. Besides the rules: the start-up stage
# markers and the ready line (while starting), and a traceback's header (the tracker must
# read it). A line with an ESC or NUL byte, which must be cleaned before anyone can say what
# it holds, the line reader finds itself (rules/linereader.py: memchr is faster than a set).
_ALWAYS = (re2.escape(tracebacks.HEADER),)


@record
class BlockHits:
    """What one pass over a block of lines found (`Matcher.scan`)."""

    rule: bool  # some line might match a rule: its lines go to the exact per-line matching
    stage: str | None  # the start-up stage of the last marker in the block, if any
    ready: bool  # the block holds SGLang's ready line
    traceback: bool = False  # the block holds a traceback's header


class Matcher:
    """All packs' rules, compiled once: one block scan per chunk, one RE2 set scan per line."""

    def __init__(self, packs: Sequence[RulePack], *, accelerate: bool = True) -> None:
        """Compile every rule; a rule id used by two packs is a ConfigError.

        `accelerate=False` keeps the block prefilter on RE2 (rules/blockscan.py).
        """
        self.rules: tuple[Rule, ...] = tuple(r for p in packs for r in p.rules)
        owner: dict[str, RulePack] = {}
        for pack in packs:
            for rule in pack.rules:
                if rule.id in owner:
                    raise ConfigError(
                        pack.path,
                        f"rules[{rule.id}].id",
                        f"rule id already used by pack {owner[rule.id].name!r} "
                        f"({owner[rule.id].path})",
                    )
                owner[rule.id] = pack
        # Two sets over the error text of one line: matches anywhere outside quotes, and
        # matches at the start only (a plain SGLang record, whose level is not printed).
        self._free = re2.Set.MatchSet(RE2_OPTIONS)
        self._start = re2.Set.MatchSet(RE2_OPTIONS)
        for rule in self.rules:
            self._free.Add(_entry(rule.pattern, at_start=False))
            self._start.Add(_entry(rule.pattern, at_start=True))
        # Per phase, one per-line scan: while starting every rule, the stage markers and the
        # ready line; once SGLang is ready only running-phase rules act (supervise/machine.py reads
        # lines only while starting or ready), a handful of patterns.
        # A rule's hits are checked again by its own regex (`_among`), so its scan pattern
        # may be a per-line superset (`line_superset`); a marker's or the ready line's hit
        # is taken as found, so theirs stay as they are.
        rules = [line_superset(unanchored(rule.pattern)) for rule in self.rules]
        self._markers = len(self.rules), len(self.rules) + len(MARKERS)
        self._lines = BlockScan([*rules, *(marker for _, _, marker in MARKERS),
                                 re2.escape(READY_LINE), *_ALWAYS],
                                accelerate=accelerate, lines=True)
        self._running_ids = tuple(i for i, r in enumerate(self.rules) if in_phase(r, "running"))
        self._lines_running = BlockScan([*(rules[i] for i in self._running_ids), *_ALWAYS],
                                        accelerate=accelerate, lines=True)
        # Non-fatal rules (notes `explain` shows; they never act) read every line as it is.
        self._notes = re2.Set.SearchSet(RE2_OPTIONS)
        self._note_ids = tuple(i for i, r in enumerate(self.rules) if not r.fatal)
        for i in self._note_ids:
            self._notes.Add(self.rules[i].pattern)
        self._free.Compile()
        self._start.Compile()
        if self._note_ids:
            self._notes.Compile()
        self._compiled: dict[str, Any] = {}
        # One regex per rule and set, for `_narrowed` (compiled on first use; a race only
        # compiles one twice).
        self._single: dict[tuple[int, bool | None], Any] = {}
        # The last few lines' answers: the reader checks a line, then the machine asks of it
        # again, three times (first_fix, advice_for, refired); a pure function of the line.
        self._recent: dict[tuple[str, bool | None], tuple[Rule, ...]] = {}
        self._recent_lock = threading.Lock()

    def prepare_scan(self) -> tuple[str, str | None]:
        """Compile both phases' scans now, not on the first chunk: the engine, and why not
        all on Hyperscan (None when all are). Each set scans once here, so that the first
        chunk of a launch does not pay for the database's first touch (a few ms). Each
        thread that scans then calls `warm_thread`."""
        for scan in (self._lines, self._lines_running):
            scan.compile()
        tracebacks.prepare(LINE_CAP)
        for i, rule in enumerate(self.rules):  # each rule's own regexes (`_narrowed`): ~6 ms
            if rule.fatal:
                self._one(i, True)
                self._one(i, False)
            else:
                self._note(i)
        self.warm_thread()  # the databases' first touch, and this thread's scratch
        return self._lines.engine, self._lines.why

    def warm_thread(self) -> None:
        """The calling thread's Hyperscan scratch space for each compiled scan (~0.1-0.3 ms;
        compiles nothing): scratch is one per thread, allocated at its first scan, which
        would otherwise be a quiet stream's fatal line. The pumps' threads call it before
        their first chunk (supervise/shell/child.py)."""
        for scan in (self._lines, self._lines_running):
            if scan.compiled:
                scan.line_ends(b"\n")
        tracebacks.warm_thread()

    def scan_takes_gil(self, starting: bool) -> bool:
        """Whether `line_scan` in that phase takes the GIL per hit (Hyperscan's callbacks, or
        RE2): the pumps scan such a chunk on the thread that reads its lines, and one the C
        searches (a set of plain literals) on the reader (supervise/shell/child.py)."""
        return (self._lines if starting else self._lines_running).engine != "literals"

    def line_scan(self, block: bytes, starting: bool) -> Hits:
        """The lines of `block` the reader must read, by the offset just past each one's
        newline (unsorted, perhaps repeated; a superset): those a rule's pattern (or, while
        starting, the ready line's) might match in, and those that hold a traceback's header
        (the tracker reads them; no rule needs to); and the start-up stage of the last
        marker in it (None: none, or not `starting`: past the start only running-phase
        rules are scanned for)."""
        if not starting:
            # In C, the lines with an ESC or a NUL come with it (-1), the GIL let go once.
            marks = self._lines_running.marks
            return self._running_hits(self._lines_running.line_ends(block, marks=marks),
                                      marks=marks)
        found = self._lines.line_ends(block)
        first, stop = self._markers
        header = self._lines.size - 1  # the markers, the ready line, then the header
        markers = [i - first for i, _ in found if first <= i < stop]
        rules: dict[int, list[int]] = {}
        for i, end in found:
            if i < first:
                rules.setdefault(end, []).append(i)
        return Hits([end for i, end in found if not first <= i < stop and i != header],
                    [end for i, end in found if i == header],
                    last_stage(block, markers) if markers else None, rules, self)

    def _running_hits(self, found: list[tuple[int, int]], *, marks: bool = True) -> Hits:
        """`line_scan`'s answer past the start from the running set's pairs (`marks`: they
        hold the lines with an ESC or a NUL, as (-1, end))."""
        header = self._lines_running.size - 1  # the header: the last pattern (_ALWAYS)
        running: dict[int, list[int]] = {}
        headers: list[int] = []
        dirty: set[int] = set()
        for i, end in found:
            if i == header:
                headers.append(end)
            elif i >= 0:
                running.setdefault(end, []).append(self._running_ids[i])
            else:
                dirty.add(end)
        return Hits(running, headers, rules=running, by=self,
                    dirty=dirty if marks else None, quick=self._quick_running)

    def literal_scan(self, starting: bool) -> LiteralScan | None:
        """`line_scan(block, starting)` as the pumps' reader runs it in C on the bytes it
        reads (rules/linescan.read_scan), the same object each time: past the start, where
        the running set is searched as literals in C. None: while starting (its scan also
        finds the stage markers), or not so searched."""
        return None if starting else self._literal_running

    @cached_property
    def _literal_running(self) -> LiteralScan | None:
        literals = self._lines_running.compile().literals
        if literals is None or linescan.read_scan is None or not self._lines_running.marks:
            return None
        return LiteralScan(literals, self._running_hits)

    @cached_property
    def _quick_running(self) -> Quick | None:
        """The quick no for the running phase's lines (rules/quick.py), where its scan is a
        set of plain literals: the fatal rules' literals, and as `present` the non-fatal
        rules' (`_among` searches the whole line for those) and the ready line (which the
        supervisor's `keeps` takes wherever it is). None: not such a set. Built on first
        use (two threads may both build it: the same value)."""
        literals = self._lines_running.literals
        if literals is None:
            return None
        rules = [(self.rules[i], literals[k]) for k, i in enumerate(self._running_ids)]
        return Quick(tuple(lit for rule, lit in rules if rule.fatal),
                     (*(lit for rule, lit in rules if not rule.fatal), READY_LINE.encode()))

    def scan(self, block: bytes) -> BlockHits:
        """What the scan while starting finds in `block` (lines left unread, a superset):
        might a line match a rule, the stage of the last marker, the ready line, a header."""
        return self._summary(self._lines, block, starting=True)

    def scan_running(self, block: bytes) -> BlockHits:
        """`scan` past the start: running-phase rules and a traceback's header only."""
        return self._summary(self._lines_running, block, starting=False)

    def _summary(self, scan: BlockScan, block: bytes, *, starting: bool) -> BlockHits:
        ids = {i for i, _ in scan.line_ends(block)}
        rules = len(self.rules) if starting else len(self._running_ids)
        header = scan.size - len(_ALWAYS)
        first, stop = self._markers
        markers = [i - first for i in ids if starting and first <= i < stop]
        return BlockHits(rule=any(i < rules for i in ids),
                         stage=last_stage(block, markers) if markers else None,
                         ready=starting and stop in ids, traceback=header in ids)

    def candidates(self, line: str, ends_traceback: bool | None = None) -> tuple[Rule, ...]:
        """The rules whose pattern matches `line` (fatal ones: its error text), in pack order.

        `ends_traceback` (rules/tracebacks.py): False when an exception-shaped `line` does not
        end a traceback, so it is no error output; None when that is not known.
        """
        if not self.rules:
            return ()
        key = (line, ends_traceback)
        found = self._recent.get(key)
        if found is not None:
            return found
        hits = _utf8_safe(lambda text: self._hits(text, ends_traceback), line)
        found = tuple(self.rules[i] for i in sorted(hits))
        with self._recent_lock:
            self._recent[key] = found
            if len(self._recent) > _RECENT:
                del self._recent[next(iter(self._recent))]
        return found

    def _hits(self, line: str, ends_traceback: bool | None) -> set[int]:
        if self._lines.compiled:
            return self._narrowed(line, ends_traceback)
        hits: set[int] = set()
        found = error_text(line, ends_traceback)
        if found is not None:
            text, at_start = found
            found_set = (self._start if at_start else self._free).Match(text) or ()
            hits.update(i for i in found_set if self.rules[i].fatal)
        if self._note_ids:
            hits.update(self._note_ids[i] for i in self._notes.Match(line) or ())
        return hits

    def _narrowed(self, line: str, ends_traceback: bool | None) -> set[int]:
        """`_hits` once the line scan is compiled (the supervisor's, `prepare_scan`): the
        scan names the rules whose widened pattern might match in `line` (a superset, per
        rule: rules/blockscan.unanchored), and each one's own RE2 regex decides, as its
        pattern in the sets would. The same answer; but a set's lazy DFA builds its states
        for all 100-odd patterns at once, so the first fatal line of a kind cost ~0.5-1 ms
        per set on the reaction path (a warm-up over the rules' texts left 5.3 MiB of
        states), where one rule's regex costs 20-60 us cold."""
        if error_text(line, ends_traceback) is None and not self._note_ids:
            return set()  # no error text, no notes: nothing to scan for (a quoting line)
        rules = len(self.rules)
        maybe = {i for i, _ in self._lines.line_ends(line.encode() + b"\n") if i < rules}
        return self._among(line, ends_traceback, maybe) if maybe else set()

    def any_of(self, line: str, ends_traceback: bool | None, maybe: Collection[int]) -> bool:
        """Whether any rule of `maybe` matches `line` as `candidates` reads it: exactly
        `bool(candidates(...))` when `maybe` holds every rule whose widened pattern a scan
        of `line` hits (Hits.rules, while starting), and so for every rule of a phase when
        `maybe` came from that phase's scan (past the start: Matcher.line_scan). The reader's
        check (supervise/shell/supervisor.Supervisor._keep) of a line the chunk's scan
        named, with no scan of its own."""
        if not maybe:
            return False
        return bool(_utf8_safe(lambda text: self._among(text, ends_traceback, maybe), line))

    def _among(self, line: str, ends_traceback: bool | None, maybe: Collection[int]
               ) -> set[int]:
        """Of the rules `maybe`, those matching `line`, each by its own regex.

        The regexes read the text's UTF-8 bytes: google-re2 matches a str by encoding it and
        then turns every span's byte offsets back into characters (a generator, a dict of
        offsets, a Match object), which this yes/no does not read; on bytes it matches the
        same bytes from the same offsets (the same answer: tests/unit/test_blockscan.py holds
        it to the RE2 sets, which read the str). Measured in-process, one rule's match: 35 ->
        9 us warm, 123 -> 85 us cold (after 0.5 s idle: a quiet stream's fatal line).
        A lone surrogate raises UnicodeEncodeError here as in the str match (`_utf8_safe`)."""
        hits: set[int] = set()
        found = error_text(line, ends_traceback)
        if found is not None:
            text, at_start = found
            data = text.encode()
            hits.update(i for i in maybe
                        if self.rules[i].fatal and self._one(i, at_start).match(data))
        if self._note_ids:
            data = line.encode()
            hits.update(i for i in maybe
                        if not self.rules[i].fatal and self._note(i).search(data))
        return hits

    def _one(self, i: int, at_start: bool) -> Any:
        """Rule `i`'s pattern as its set entry reads it (`_start` or `_free`), compiled once."""
        key = (i, at_start)
        regex = self._single.get(key)
        if regex is None:
            regex = self._single[key] = re2.compile(
                _entry(self.rules[i].pattern, at_start=at_start), RE2_OPTIONS)
        return regex

    def _note(self, i: int) -> Any:
        """Non-fatal rule `i`'s pattern as `_notes` reads it (unanchored), compiled once."""
        regex = self._single.get((i, None))
        if regex is None:
            regex = self._single[(i, None)] = re2.compile(self.rules[i].pattern, RE2_OPTIONS)
        return regex

    def diagnose(self, rule: Rule, line: str) -> str:
        """`rule.reason` with `{name}` replaced by the pattern's named group from `line`."""
        if "{" not in rule.reason:
            return rule.reason
        found = error_text(line)
        regex = self._compiled.get(rule.id)
        if regex is None:
            regex = self._compiled[rule.id] = compile_pattern(rule.pattern)
        match = regex.search(found[0]) if found is not None else None
        groups = {k: v for k, v in (match.groupdict() if match else {}).items() if v}
        return str(_PLACEHOLDER.sub(lambda m: groups.get(m.group(1), "?"), rule.reason))


def _entry(pattern: str, *, at_start: bool) -> str:
    """A rule's pattern as the exact matcher reads an error text with it (each set, and each
    rule's own regex, anchored at the text's start): at its start, or anywhere outside
    quotes (QUOTE_LEAD)."""
    return f"(?:{pattern})" if at_start else f"{QUOTE_LEAD}(?:{pattern})"


def _utf8_safe(find: Callable[[str], set[int]], line: str) -> set[int]:
    """`find(line)`; for a line with lone surrogates (surrogateescape input), which RE2
    cannot take as UTF-8, `find` of the line with them replaced."""
    try:
        return find(line)
    except UnicodeEncodeError:
        return find(line.encode("utf-8", "replace").decode("utf-8"))


_PLACEHOLDER = re2.compile(r"\{(\w+)\}")
_RECENT = 8  # lines whose `candidates` a Matcher keeps (each at most LINE_CAP characters)


@lru_cache(maxsize=512)
def _compiled(pattern: str) -> Any:
    return compile_pattern(pattern)


def captures(rule: Rule, line: str | None) -> dict[str, str]:
    """The named groups of `rule.pattern` that matched in `line` ({} if none, or no line)."""
    if line is None or "(?P<" not in rule.pattern:
        return {}
    try:
        found = _compiled(rule.pattern).search(line)
    except UnicodeEncodeError:  # lone surrogates, as in Matcher.candidates
        found = _compiled(rule.pattern).search(line.encode("utf-8", "replace").decode("utf-8"))
    if found is None:
        return {}
    return {k: v for k, v in found.groupdict().items() if v is not None}


def in_phase(rule: Rule, phase: str) -> bool:
    """Whether `rule` acts in this phase of the server ("start" or "running")."""
    return rule.phase in ("any", phase)


def _conditions_hold(cond: Conditions, ctx: MatchContext) -> bool:
    if cond.arch and ctx.arch != "unknown" and ctx.arch not in cond.arch:
        return False
    if ctx.sm is not None:
        if cond.sm_min is not None and ctx.sm < cond.sm_min:
            return False
        if cond.sm_max is not None and ctx.sm > cond.sm_max:
            return False
    if (cond.sglang is not None and ctx.sglang_version is not None
            and _version_in(ctx.sglang_version, cond.sglang) is False):
        return False  # (None: an unreadable version is an unknown one)
    for flag, want in cond.flags:
        present = flag in ctx.flags
        if isinstance(want, bool):
            if present != want:
                return False
        elif not present or ctx.flags[flag] not in want:
            return False
    return True


@lru_cache(maxsize=256)
def _version_in(version: str, spec: str) -> bool | None:
    """Whether release `version` is in the specifier set `spec`; None: `version` is unreadable.
    Parsed once per pair: packaging's parse of both costs ~30-60 us cold, on the path from a
    fatal line to its SIGTERM (supervise/machine.stops_at), for every rule with a range."""
    try:
        return Version(version) in SpecifierSet(spec)
    except InvalidVersion:
        return None


def warm_ranges(rules: Iterable[Rule], version: str | None) -> None:
    """Parse each rule's release range against `version` now (`_version_in` keeps the answers),
    so that the first fatal line's decision does not (supervise/machine.rehearse)."""
    if version is not None:
        for spec in {rule.conditions.sglang for rule in rules if rule.conditions.sglang}:
            _version_in(version, spec)


def plan_fix(rule: Rule, ctx: MatchContext, line: str | None = None) -> Fix | None:
    """The change `rule` asks for on this command line; None if it does not apply.

    `line` is the log line that matched: a `scale:`/`above:` value may use what it names, and
    an `undo_guard_edit` rule acts only when it names the flag the guard's last fix changed.
    What each kind plans is its own (rules/fixes.py FIX_KINDS).
    """
    if not _conditions_hold(rule.conditions, ctx):
        return None
    spec = FIX_KINDS[rule.action]
    caps = captures(rule, line) if spec.changes_flag else {}  # a flag's value may use them
    return spec.plan(rule, ctx, caps, line)


def acts(rule: Rule) -> bool:
    """Whether `rule` may act (an advice rule is only shown: `advice_for`)."""
    return FIX_KINDS[rule.action].acts


def is_catch_all(rule: Rule) -> bool:
    """A catch-all (a crash banner printed before the real cause): below-zero priority, so
    that a specific rule of the same crash wins (the machine lets it wait for one)."""
    return rule.priority < 0


def precedence(rule: Rule) -> tuple[bool, bool, int]:
    """The order rules of one line are tried in (a sort key; ties keep pack order): fatal
    before notes, actions before advice, then descending priority. The one ordering of
    the guard: the machine's `first_fix` and `explain`'s listing both use it; which line of a
    burst wins is the machine's alone (supervise/machine.py, replayed by supervise/replay.py)."""
    return (not rule.fatal, not acts(rule), -rule.priority)


def acting(matcher: Matcher, line: str, phase: str, ends_traceback: bool | None = None
           ) -> tuple[Rule, ...]:
    """The rules that may act on `line` in this phase (fatal ones, advice left out), in pack
    order: `first_fix` tries them by `precedence`, `refired` looks for one that fired."""
    return tuple(r for r in matcher.candidates(line, ends_traceback)
                 if r.fatal and acts(r) and in_phase(r, phase))


def refired(matcher: Matcher, line: str, fired: Mapping[str, int], phase: str,
            ends_traceback: bool | None = None) -> tuple[Rule, ...]:
    """The rules acting on `line` that fired before, in pack order (when `first_fix` finds
    nothing left to change for them, their fix did not hold)."""
    return tuple(r for r in acting(matcher, line, phase, ends_traceback)
                 if fired.get(r.id, 0) > 0)


def first_fix(
    matcher: Matcher, line: str, ctx: MatchContext, fired: Mapping[str, int],
    ends_traceback: bool | None = None,
) -> tuple[Fix | None, tuple[Rule, ...]]:
    """The fix for `line` and the matching fatal rules skipped because their budget ran out.

    Candidates are tried by descending priority, then pack order; a rule applies when its
    conditions hold, it has fires left and `plan_fix` finds something to change. Advice
    rules are never candidates: they change nothing (see `advice_for`).
    """
    chosen, exhausted = choose_fix(matcher, line, ctx, fired, ends_traceback)
    if chosen is not None:
        chosen = replace(chosen, diagnosis=matcher.diagnose(chosen.rule, line))
    return chosen, exhausted


def choose_fix(
    matcher: Matcher, line: str, ctx: MatchContext, fired: Mapping[str, int],
    ends_traceback: bool | None = None,
) -> tuple[Fix | None, tuple[Rule, ...]]:
    """`first_fix` without the fix's diagnosis (what the machine's choice rests on, alone:
    supervise/machine.stops_at asks it from a reader thread)."""
    candidates = sorted(acting(matcher, line, ctx.phase, ends_traceback), key=precedence)
    exhausted: list[Rule] = []
    chosen: Fix | None = None
    for rule in candidates:
        if fired.get(rule.id, 0) >= rule.max_fires:
            if _conditions_hold(rule.conditions, ctx):
                exhausted.append(rule)
            continue
        if chosen is None:
            chosen = plan_fix(rule, ctx, line)
    return chosen, tuple(exhausted)


def advice_for(matcher: Matcher, line: str, ctx: MatchContext,
               ends_traceback: bool | None = None) -> tuple[Rule, ...]:
    """The advice rules (no automatic action) that `line` triggers on this command line."""
    return tuple(r for r in matcher.candidates(line, ends_traceback)
                 if not acts(r) and in_phase(r, ctx.phase)
                 and _conditions_hold(r.conditions, ctx))


def advice_record(rule: Rule, line: str, gen: int) -> Advice:
    """The journal record of an advice rule that matched: what to read, nothing changed."""
    return Advice(rule=rule.id, record=rule.record, line=line, gen=gen, reason=rule.reason,
                  explanation=rule.explanation, solutions=list(rule.solutions),
                  prevention=list(rule.prevention), source=rule.source)
