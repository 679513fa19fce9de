"""Log rules at work: which rule a log line triggers, and the flag change that answers it.

`Matcher` compiles every pack's patterns (see `core/rulepack.py`) into RE2 sets, and
`first_fix` turns a matching line into at most one `Fix` for the current command line.
RE2 matching is linear in the line, so a hostile pattern cannot stall the log pipe.

A rule reads SGLang's own error output only (`core/logline.error_text`): the text of an
exception line, an error-level record or argparse's error anywhere outside quotes, a plain
SGLang record's message from its start. A logged request, an access line or a quoted string
never triggers one. A rule acts in its phase only (`Rule.phase`: start, running or any).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import re2
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from sglang_guard.core import tracebacks
from sglang_guard.core.blockscan import BlockScan, unanchored
from sglang_guard.core.logline import error_text
from sglang_guard.core.options import OptionTable
from sglang_guard.core.rulepack import (
    ABOVE,
    ACTIONS,
    CURRENT_GROUP,
    FLAG_ACTIONS,
    RE2_OPTIONS,
    SCALE,
    Conditions,
    Rule,
    RulePack,
    compile_pattern,
    free_port_group,
    load_default_pack,
    load_default_packs,
    number,
    parse_pack,
)
from sglang_guard.core.stages import MARKERS, READY_LINE, last_stage
from sglang_guard.errors import ConfigError

__all__ = [
    "ACTIONS",
    "Conditions",
    "Fix",
    "MatchContext",
    "Matcher",
    "Rule",
    "RulePack",
    "advice_for",
    "advice_record",
    "captures",
    "compile_pattern",
    "first_fix",
    "in_phase",
    "load_default_pack",
    "load_default_packs",
    "parse_pack",
    "plan_fix",
    "precedence",
]


@dataclass(frozen=True, slots=True)
class MatchContext:
    """What the rules may look at besides the line."""

    flags: Mapping[str, str | None]
    arch: str
    sm: int | None
    sglang_version: str | None
    # The parser of the release that runs: a fix it would reject (an option that release
    # lacks, a value outside its choices) is never planned; the next rule is tried instead.
    options: OptionTable | None = None
    # The flag the guard's own last fix changed (None: no fix since the last ready launch).
    last_edit_flag: str | None = None
    phase: str = "start"  # "start" before SGLang is ready, "running" after


@dataclass(frozen=True, slots=True)
class Fix:
    """One change to the command line (or a restart / give-up) that a rule asks for."""

    rule: Rule
    action: str
    flag: str | None
    old_value: str | None
    new_value: str | None
    diagnosis: str = ""  # the rule's reason with the line's named groups filled in (first_fix)
    # `free_port`: the new value is a port the shell picks just before the next launch
    # (new_value stays None here); `busy_port` is the one SGLang named, when the line says.
    free_port: bool = False
    busy_port: int | None = None


# --- matching ------------------------------------------------------------------------------

# A match must start outside quotes: the text before it is unquoted characters, escapes and
# whole quoted strings ('...' or "...", as Python's repr writes them). Anchored at the start
# of the text; RE2 keeps it linear.
QUOTE_LEAD = r"""(?:[^'"\\]|\\.|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")*?"""
# The prefilter's lead, per line of a block: a superset of where `error_text` lets a rule
# read -- anywhere outside quotes, from column 0 (an SGLang record's message, an ERROR: level,
# an exception line, argparse's error, and since issue 20 every line of SGLang's own output,
# C++/CUDA/NCCL stderr included), with the quote rule of QUOTE_LEAD within one line.
# Logged requests, access lines and other quoted text never pass it (their text is inside
# quotes), so those near-miss lines cost no per-line work; which lines are requests' or
# frames is the reader's to say (core/tracebacks.py), not the prefilter's.
_BLOCK_QUOTES = (r"""(?:[^'"\\\n]|\\[^\n]|'(?:[^'\\\n]|\\[^\n])*'"""
                 r"""|"(?:[^"\\\n]|\\[^\n])*")*?""")
BLOCK_LEAD = r"(?m)^" + _BLOCK_QUOTES


@dataclass(frozen=True, slots=True)
class BlockHits:
    """What one pass over a block of lines found (`Matcher.scan`)."""

    rule: bool  # some line might match a rule: its lines go to the exact per-line matching
    stage: str | None  # the start-up stage of the last marker in the block, if any
    ready: bool  # the block holds SGLang's ready line
    traceback: bool = False  # the block holds a traceback's header


_NO_HITS = BlockHits(rule=False, stage=None, ready=False)


class Matcher:
    """All packs' rules, compiled once: one block scan per chunk, one RE2 set scan per line."""

    def __init__(self, packs: Sequence[RulePack], *, accelerate: bool = True) -> None:
        """Compile every rule; a rule id used by two packs is a ConfigError.

        `accelerate=False` keeps the block prefilter on RE2 (core/blockscan.py).
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
            self._free.Add(f"{QUOTE_LEAD}(?:{rule.pattern})")
            self._start.Add(f"(?:{rule.pattern})")
        # The patterns over a block of many lines, each behind BLOCK_LEAD: a block that
        # matches nothing holds no line that would (a superset test, core/blockscan.py).
        # The start-up stage markers (the stall watch), the ready line and a traceback's
        # header (its lines are read one by one: core/tracebacks.py) share the scan, after
        # the rules.
        # A rule's own anchors are dropped there (Hyperscan takes none behind a lead).
        self._block = BlockScan([*(f"{BLOCK_LEAD}(?:{unanchored(rule.pattern)})"
                                   for rule in self.rules),
                                 *(marker for _, _, marker in MARKERS), re2.escape(READY_LINE),
                                 re2.escape(tracebacks.HEADER)],
                                accelerate=accelerate)
        # Once SGLang is ready only running-phase rules act: a chatty server's log is
        # scanned for those (and traceback headers) alone, a handful of patterns.
        self._running_ids = tuple(i for i, r in enumerate(self.rules) if in_phase(r, "running"))
        self._block_running = BlockScan(
            [*(self._block.patterns[i] for i in self._running_ids),
             re2.escape(tracebacks.HEADER)], accelerate=accelerate)
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

    def prepare_scan(self) -> tuple[str, str | None]:
        """Compile the block prefilter now, not on the first chunk: its engine, and why not
        all on Hyperscan (None when all are)."""
        self._block_running.compile()
        return self._block.engine, self._block.why

    def scan(self, block: bytes) -> BlockHits:
        """One pass over `block` while SGLang starts: might a line match a rule, the last
        stage it starts, the ready line (past the start: `scan_running`)."""
        hits = self._block.hits(block)
        if not hits:
            return _NO_HITS
        n, ready, header = len(self.rules), self._block.size - 2, self._block.size - 1
        markers = [i - n for i in hits if n <= i < ready]
        return BlockHits(rule=any(i < n for i in hits),
                         stage=last_stage(block, markers) if markers else None,
                         ready=ready in hits, traceback=header in hits)

    def scan_running(self, block: bytes) -> BlockHits:
        """`scan` for a server past its start: might a line match a running-phase rule, and
        does the block hold a traceback's header (no stages, no ready line then)."""
        hits = self._block_running.hits(block)
        if not hits:
            return _NO_HITS
        header = self._block_running.size - 1
        return BlockHits(rule=any(i < header for i in hits), stage=None, ready=False,
                         traceback=header in hits)

    def candidates(self, line: str, ends_traceback: bool | None = None) -> tuple[Rule, ...]:
        """The rules whose pattern matches `line` (fatal ones: its error text), in pack order.

        `ends_traceback` (core/tracebacks.py): False when an exception-shaped `line` does not
        end a traceback, so it is no error output; None when that is not known.
        """
        if not self.rules:
            return ()
        try:
            hits = self._hits(line, ends_traceback)
        except UnicodeEncodeError:  # lone surrogates (surrogateescape input): RE2 needs UTF-8
            hits = self._hits(line.encode("utf-8", "replace").decode("utf-8"), ends_traceback)
        return tuple(self.rules[i] for i in sorted(hits))

    def _hits(self, line: str, ends_traceback: bool | None) -> set[int]:
        hits: set[int] = set()
        found = error_text(line, ends_traceback)
        if found is not None:
            text, at_start = found
            found_set = (self._start if at_start else self._free).Match(text) or ()
            hits.update(i for i in found_set if self.rules[i].fatal)
        if self._note_ids:
            hits.update(self._note_ids[i] for i in self._notes.Match(line) or ())
        return hits

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


_PLACEHOLDER = re2.compile(r"\{(\w+)\}")


# `above:G` sets the flag this much above the number SGLang names (then caps it).
ABOVE_STEP = 0.01


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


def _above(rule: Rule, caps: Mapping[str, str], current: str | None) -> str | None:
    """`above:G`: just above the captured number, within `maximum`; None if that is no raise."""
    assert rule.new_value is not None  # noqa: S101  (callers check; narrows for mypy)
    floor = number((caps.get(rule.new_value[len(ABOVE) :]) or "").rstrip("."))
    if floor is None:
        return None
    value = round(floor + ABOVE_STEP, 3)
    if rule.maximum is not None and value > rule.maximum:
        return None  # SGLang needs more than the cap allows: no fix, rather than a futile one
    old = number(current.rstrip(".") if current is not None else None)
    if old is not None and old >= value:
        return None  # never the wrong direction
    return format(value, "g")


def _scaled(rule: Rule, current: str | None, seen: str | None = None) -> str | None:
    """`scale:F` applied to the current value (else the one the log names, else the default)."""
    assert rule.new_value is not None  # noqa: S101  (callers check; narrows for mypy)
    # A number the log names may end a sentence ("...=0.88."): the dot is not part of it.
    # One that does not parse gives way to the rule's default, as an absent flag does.
    seen = seen.rstrip(".") if seen is not None else None
    if current is None and number(seen) is None:
        seen = None
    base_text = current if current is not None else seen if seen is not None else rule.default
    base = number(base_text)
    if base_text is None or base is None:
        return None
    value = base * float(rule.new_value[len(SCALE) :])
    if rule.minimum is not None:
        value = max(value, rule.minimum)
    if rule.maximum is not None:
        value = min(value, rule.maximum)
    if base.is_integer() and "." not in base_text and "e" not in base_text.lower():
        return str(max(1, int(value)))  # a count (a batch size) stays a whole number >= 1
    return format(round(value, 4), "g")


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
    if cond.sglang is not None and ctx.sglang_version is not None:
        try:
            if Version(ctx.sglang_version) not in SpecifierSet(cond.sglang):
                return False
        except InvalidVersion:
            pass  # an unreadable version is an unknown one
    for flag, want in cond.flags:
        present = flag in ctx.flags
        if isinstance(want, bool):
            if present != want:
                return False
        elif not present or ctx.flags[flag] not in want:
            return False
    return True


def plan_fix(rule: Rule, ctx: MatchContext, line: str | None = None) -> Fix | None:
    """The change `rule` asks for on this command line; None if it does not apply.

    `line` is the log line that matched: a `scale:`/`above:` value may use what it names.
    """
    if not _conditions_hold(rule.conditions, ctx):
        return None
    if rule.action not in FLAG_ACTIONS:
        return Fix(rule, rule.action, None, None, None)
    caps = captures(rule, line)
    for flag in rule.flags:
        if not _release_has(ctx.options, flag):
            continue
        present = flag in ctx.flags
        old = ctx.flags.get(flag)
        if present and rule.values is not None and old not in rule.values:
            continue
        if rule.action == "drop_flag":
            if present:
                return Fix(rule, "drop_flag", flag, old, None)
            continue
        if not present and rule.action == "rewrite_value":
            continue
        group = free_port_group(rule.new_value)
        if group is not None:
            busy = _port(caps.get(group)) if group else None
            if present and busy is not None and _port(old) != busy:
                continue  # the busy port is not this flag's: nothing here to move
            return Fix(rule, rule.action, flag, old if present else None, None,
                       free_port=True, busy_port=busy)
        new = rule.new_value
        if new is not None and new.startswith(SCALE):
            new = _scaled(rule, old, caps.get(CURRENT_GROUP))
            if new is None:
                continue
        elif new is not None and new.startswith(ABOVE):
            new = _above(rule, caps, old if present else caps.get(CURRENT_GROUP))
            if new is None:
                continue
        if present and new == old:
            continue  # already so: this fix would change nothing
        if not _release_accepts(ctx.options, flag, new):
            continue
        return Fix(rule, rule.action, flag, old if present else None, new)
    return None


def _port(text: str | None) -> int | None:
    """A TCP port number from a command line or a log line (None if it is not one)."""
    if text is None or not text.strip().isdigit():
        return None
    value = int(text)
    return value if 0 < value < 65536 else None


def _release_has(options: OptionTable | None, flag: str) -> bool:
    """True if the running release's parser knows `flag` exactly (or no table is known)."""
    return options is None or flag in options.by_string


def _release_accepts(options: OptionTable | None, flag: str, value: str | None) -> bool:
    """True if that parser would take `flag value` (a choice it lists, or any value)."""
    if options is None or value is None:
        return True
    spec = options.get(flag)
    if spec is None:  # the release has no such option: its parser rejects any value
        return False
    return spec.choices is None or value in spec.choices


def precedence(rule: Rule) -> tuple[bool, bool, int]:
    """The order rules of one line are tried in (a sort key; ties keep pack order): fatal
    before notes, actions before advice, then descending priority. The one ordering of
    the guard: the machine's `first_fix` and `explain`'s listing both use it; which line of a
    burst wins is the machine's alone (core/machine.py, replayed by core/replay.py)."""
    return (not rule.fatal, rule.action == "advice", -rule.priority)


def first_fix(
    matcher: Matcher, line: str, ctx: MatchContext, fired: Mapping[str, int],
    ends_traceback: bool | None = None,
) -> tuple[Fix | None, tuple[Rule, ...]]:
    """The fix for `line` and the matching fatal rules skipped because their budget ran out.

    Candidates are tried by descending priority, then pack order; a rule applies when its
    conditions hold, it has fires left and `plan_fix` finds something to change. Advice
    rules are never candidates: they change nothing (see `advice_for`).
    """
    candidates = sorted((r for r in matcher.candidates(line, ends_traceback)
                         if r.fatal and r.action != "advice" and in_phase(r, ctx.phase)),
                        key=precedence)
    exhausted: list[Rule] = []
    chosen: Fix | None = None
    for rule in candidates:
        if fired.get(rule.id, 0) >= rule.max_fires:
            if _conditions_hold(rule.conditions, ctx):
                exhausted.append(rule)
            continue
        if chosen is None:
            chosen = _undo(rule, ctx, line) if rule.action == "undo_guard_edit" \
                else plan_fix(rule, ctx, line)
    if chosen is not None:
        chosen = replace(chosen, diagnosis=matcher.diagnose(chosen.rule, line))
    return chosen, tuple(exhausted)


def _undo(rule: Rule, ctx: MatchContext, line: str) -> Fix | None:
    """Undo the guard's last fix when the parser's rejection names the flag it changed."""
    flag = ctx.last_edit_flag
    if flag is None or not _conditions_hold(rule.conditions, ctx) or flag not in line:
        return None
    return Fix(rule, "undo_guard_edit", flag, ctx.flags.get(flag), None)


def advice_for(matcher: Matcher, line: str, ctx: MatchContext,
               ends_traceback: bool | None = None) -> tuple[Rule, ...]:
    """The advice rules (no automatic action) that `line` triggers on this command line."""
    return tuple(r for r in matcher.candidates(line, ends_traceback)
                 if r.action == "advice" and in_phase(r, ctx.phase)
                 and _conditions_hold(r.conditions, ctx))


def advice_record(rule: Rule, line: str, gen: int) -> dict[str, Any]:
    """The journal record of an advice rule that matched: what to read, nothing changed."""
    return {"event": "advice", "trigger": "log", "rule": rule.id, "record": rule.record,
            "line": line, "gen": gen, "reason": rule.reason, "explanation": rule.explanation,
            "solutions": list(rule.solutions), "prevention": list(rule.prevention),
            "source": rule.source}
