"""The fix vocabulary: what a rule does (`FixKind`) and the forms its `new_value` takes.

A rule pack's `new_value` is read once, when the pack is parsed, into one of four values:

- `Literal` (`"fa3"`): the flag is set to this text;
- `Scale` (`"scale:F"`): the current value (else the one the log names, else `default`) times
  F, clamped to `minimum`/`maximum`;
- `Above` (`"above:G"`): just above the number the pattern's group G captures, capped by
  `maximum`, never lower than the flag is;
- `FreePort` (`"free_port"`, `"free_port:G"`): a port the shell finds free just before the next
  launch (the core has no sockets); with G, the busy port SGLang names, and a flag on the
  command line is moved only when it holds that port.

`FIX_KINDS[kind]` holds, for each kind, what a pack must and must not say for it (`parse`), the
change it makes on a command line (`plan`), what the machine does with that change (`apply`:
a `Reaction`, which `supervise/machine.py` matches on) and its line in `explain` (`render`). A new
kind is one entry here plus its row in docs/fix-kinds.md (tests/unit/test_fix_kinds.py holds
both); a new `new_value` form is one value class here, its branch in `parse_value` and
`_set_to`, and its row there.

Pure: no I/O. `rules/rulepack.py` calls `parse`; `rules/rules.py` calls `plan` after the rule's
conditions hold; the machine calls `apply`; `rules/shell/explain.py` calls `render`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import assert_never

from sglang_guard.common.outcomes import FixKind
from sglang_guard.common.record import record
from sglang_guard.config.tomlread import Table
from sglang_guard.errors import EXIT_ENVIRONMENT, EXIT_GIVE_UP, EXIT_USAGE
from sglang_guard.rules.fixvalues import (
    CURRENT_GROUP,
    Above,
    FreePort,
    Literal,
    NewValue,
    RuleFields,
    Scale,
    number,
    parse_value,
)
from sglang_guard.rules.rule import Rule
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.redact import MASK, is_secret_flag

__all__ = [
    "CURRENT_GROUP",
    "FIX_KINDS",
    "Above",
    "EditFlag",
    "EndGuard",
    "Fix",
    "FixKind",
    "FixKindSpec",
    "FreePort",
    "Literal",
    "MatchContext",
    "NewValue",
    "PickFreePort",
    "Reaction",
    "Relaunch",
    "RuleFields",
    "Scale",
    "UndoLastEdit",
    "number",
]

@record
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


@record
class Fix:
    """One change to the command line (or a restart / give-up) that a rule asks for."""

    rule: Rule
    action: FixKind
    flag: str | None
    old_value: str | None
    new_value: str | None
    diagnosis: str = ""  # the rule's reason with the line's named groups filled in (first_fix)
    # `free_port`: the new value is a port the shell picks just before the next launch
    # (new_value stays None here); `busy_port` is the one SGLang named, when the line says.
    free_port: bool = False
    busy_port: int | None = None


# --- what the machine does with a fix (supervise/machine.py matches on these) -------------------


@record
class EndGuard:
    """Stop SGLang and end the guard with `code` (journaled `give_up.planned`)."""

    code: int
    exit_reason: str  # the guard's exit line
    reason: str  # the journal's
    klass: str | None = None  # the record's `class` (environment, usage)
    status: str | None = None  # systemd's status line, if one is shown


@record
class Relaunch:
    """Restart SGLang with the same command line; counts as a failure (crash.detected)."""

    reason: str


@record
class UndoLastEdit:
    """Restore the command line before the guard's own last fix."""


@record
class EditFlag:
    """Drop the fix's flag (`drop`) or set it to `value`, then relaunch."""

    value: str | None
    drop: bool = False


@record
class PickFreePort:
    """Stop SGLang, have the shell pick a free port for the flag, then relaunch with it."""


Reaction = EndGuard | Relaunch | UndoLastEdit | EditFlag | PickFreePort


# --- each kind: parse, plan, apply, render ---------------------------------------------------


@record
class FixKindSpec:
    """One fix kind: what a pack says for it, what it plans, does and shows."""

    kind: FixKind
    changes_flag: bool  # takes `flags`: the flags it drops, sets or rewrites
    parse: Callable[[Table, RuleFields], NewValue | None]
    # After the rule's conditions held: (rule, context, the line's named groups, the line).
    plan: Callable[[Rule, MatchContext, Mapping[str, str], str | None], Fix | None]
    apply: Callable[[Fix, str], Reaction]  # the fix and the line it answers
    render: Callable[[Fix], str]  # `explain`'s "fix:" line
    label: str = ""  # how `explain` names a rule of this kind ("": its kind)
    # False: the rule never acts, it is only shown (advice); such rules sort after the rest.
    acts: bool = True


def _needs_flags(chk: Table, fields: RuleFields, verb: str) -> None:
    if not fields.flags:
        raise chk.fail("flags", f"{fields.kind} needs the flag(s) it {verb}")


def _no_new_value(chk: Table, fields: RuleFields) -> NewValue | None:
    if fields.new_value is not None:
        raise chk.fail("new_value", f"{fields.kind} takes no new_value")
    return parse_value(chk, fields)  # None; refuses a default/minimum/maximum


def _parse_whole(chk: Table, fields: RuleFields) -> NewValue | None:
    """A kind that changes no flag: no `flags`, no `new_value`."""
    if fields.flags:
        raise chk.fail("flags", f"{fields.kind} changes no flag")
    return _no_new_value(chk, fields)


def _parse_environment(chk: Table, fields: RuleFields) -> NewValue | None:
    if fields.flags:
        raise chk.fail("flags", f"{fields.kind} changes no flag")
    if not fields.reason:
        raise chk.fail("reason", "an environment rule needs the one-line diagnosis it gives")
    return _no_new_value(chk, fields)


def _parse_drop(chk: Table, fields: RuleFields) -> NewValue | None:
    _needs_flags(chk, fields, "drops")
    return _no_new_value(chk, fields)


def _parse_set(chk: Table, fields: RuleFields) -> NewValue | None:
    """`new_value` in any form, or none (a flag that takes no value)."""
    _needs_flags(chk, fields, "changes")
    return parse_value(chk, fields)


def _parse_rewrite(chk: Table, fields: RuleFields) -> NewValue | None:
    _needs_flags(chk, fields, "changes")
    if fields.new_value is None:
        raise chk.fail("new_value", "rewrite_value needs a new_value")
    return parse_value(chk, fields)  # free_port is set_flag's alone (parse_value says so)


def _whole(rule: Rule, ctx: MatchContext, caps: Mapping[str, str], line: str | None
           ) -> Fix | None:
    """A kind that changes no flag: the fix is the rule itself."""
    return Fix(rule, rule.action, None, None, None)


def _flags(rule: Rule, ctx: MatchContext) -> Iterator[tuple[str, bool, str | None]]:
    """(flag, on the command line, its value) for each of the rule's flags the running release
    knows, in the rule's order, leaving out one whose value is not among the rule's `values`."""
    for flag in rule.flags:
        if not _release_has(ctx.options, flag):
            continue
        present = flag in ctx.flags
        old = ctx.flags.get(flag)
        if present and rule.values is not None and old not in rule.values:
            continue
        yield flag, present, old


def _plan_drop(rule: Rule, ctx: MatchContext, caps: Mapping[str, str], line: str | None
               ) -> Fix | None:
    return next((Fix(rule, FixKind.DROP_FLAG, flag, old, None)
                 for flag, present, old in _flags(rule, ctx) if present), None)


def _plan_set(rule: Rule, ctx: MatchContext, caps: Mapping[str, str], line: str | None
              ) -> Fix | None:
    """The first flag the new value changes, added when absent."""
    return next((fix for flag, present, old in _flags(rule, ctx)
                 if (fix := _set_to(rule, ctx, flag, old=old, present=present, caps=caps))
                 is not None), None)


def _plan_rewrite(rule: Rule, ctx: MatchContext, caps: Mapping[str, str], line: str | None
                  ) -> Fix | None:
    """As set_flag, for a flag on the command line only."""
    return next((fix for flag, present, old in _flags(rule, ctx) if present
                 if (fix := _set_to(rule, ctx, flag, old=old, present=True, caps=caps))
                 is not None), None)


def _set_to(rule: Rule, ctx: MatchContext, flag: str, *, old: str | None, present: bool,
            caps: Mapping[str, str]) -> Fix | None:
    """The rule's new value for `flag`, planned from its form; None: nothing to change here."""
    new: str | None
    match rule.new_value:
        case FreePort(group=group):
            busy = _port(caps.get(group)) if group else None
            if present and busy is not None and _port(old) != busy:
                return None  # the busy port is not this flag's: nothing here to move
            return Fix(rule, rule.action, flag, old, None, free_port=True, busy_port=busy)
        case Scale() as scale:
            new = scale.value(old, caps.get(CURRENT_GROUP))
        case Above() as above:
            new = above.value(caps, old if present else caps.get(CURRENT_GROUP))
        case Literal(text=text):
            new = text
        case None:
            new = None  # a flag that takes no value
        case _ as unknown:
            assert_never(unknown)
    if new is None and rule.new_value is not None:
        return None  # the form finds no value here
    if present and new == old:
        return None  # already so: this fix would change nothing
    if not _release_accepts(ctx.options, flag, new):
        return None
    return Fix(rule, rule.action, flag, old, new)


def _plan_undo(rule: Rule, ctx: MatchContext, caps: Mapping[str, str], line: str | None
               ) -> Fix | None:
    """Undo the guard's last fix when the parser's rejection names the flag it changed."""
    flag = ctx.last_edit_flag
    if flag is None or line is None or flag not in line:
        return None
    return Fix(rule, FixKind.UNDO_GUARD_EDIT, flag, ctx.flags.get(flag), None)


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


def _apply_give_up(fix: Fix, line: str) -> Reaction:
    why = fix.diagnosis or fix.rule.reason  # the reason with the line's port, address, name
    return EndGuard(EXIT_GIVE_UP, f"{fix.rule.id}: {why}", why)


def _apply_environment(fix: Fix, line: str) -> Reaction:
    why = fix.diagnosis or fix.rule.reason
    return EndGuard(EXIT_ENVIRONMENT, f"{fix.rule.id}: {why}", why, "environment",
                    f"environment failure: {why}")


def _apply_parser_exit(fix: Fix, line: str) -> Reaction:
    """SGLang's parser exits 2: the same line fails the same way on every launch."""
    return EndGuard(EXIT_USAGE, f"{fix.rule.id}: {line.strip()}", fix.rule.reason, "usage",
                    f"SGLang's parser rejects the command line: {line.strip()}")


def _apply_restart(fix: Fix, line: str) -> Reaction:
    return Relaunch(fix.rule.reason)


def _apply_undo(fix: Fix, line: str) -> Reaction:
    return UndoLastEdit()


def _apply_edit(fix: Fix, line: str) -> Reaction:
    if fix.free_port:
        return PickFreePort()
    return EditFlag(fix.new_value, drop=fix.action == FixKind.DROP_FLAG)


def _apply_advice(fix: Fix, line: str) -> Reaction:
    raise ValueError(f"{fix.rule.id}: an advice rule changes nothing (rules.advice_for)")


def _render_named(fix: Fix) -> str:
    return f"fix: {fix.action} ({fix.rule.id}): {fix.rule.reason}"


def _render_exit(code: int) -> Callable[[Fix], str]:
    def render(fix: Fix) -> str:
        return f"fix: none, the guard exits {code} ({fix.rule.id}): {fix.rule.reason}"
    return render


def _secret(fix: Fix) -> bool:
    """A secret flag's values are shown masked (issue 24: secrets masked everywhere)."""
    return fix.flag is not None and is_secret_flag(fix.flag)


def _render_drop(fix: Fix) -> str:
    old = MASK if _secret(fix) and fix.old_value else fix.old_value or ""
    return f"fix: drop {fix.flag} {old} ({fix.rule.id})".replace("  ", " ")


def _render_set(fix: Fix) -> str:
    if fix.free_port:
        return f"fix: set {fix.flag} to a free port, picked at the next launch ({fix.rule.id})"
    value = "" if fix.new_value is None else f" {MASK if _secret(fix) else fix.new_value}"
    return f"fix: set {fix.flag}{value} ({fix.rule.id})"


FIX_KINDS: Mapping[FixKind, FixKindSpec] = {spec.kind: spec for spec in (
    FixKindSpec(FixKind.DROP_FLAG, True, _parse_drop, _plan_drop, _apply_edit, _render_drop),
    FixKindSpec(FixKind.SET_FLAG, True, _parse_set, _plan_set, _apply_edit, _render_set),
    FixKindSpec(FixKind.REWRITE_VALUE, True, _parse_rewrite, _plan_rewrite, _apply_edit,
                _render_set),
    FixKindSpec(FixKind.RESTART, False, _parse_whole, _whole, _apply_restart, _render_named),
    FixKindSpec(FixKind.GIVE_UP, False, _parse_whole, _whole, _apply_give_up, _render_named),
    FixKindSpec(FixKind.UNDO_GUARD_EDIT, False, _parse_whole, _plan_undo, _apply_undo,
                _render_set),
    FixKindSpec(FixKind.ENVIRONMENT, False, _parse_environment, _whole, _apply_environment,
                _render_exit(EXIT_ENVIRONMENT), label=f"environment (exit {EXIT_ENVIRONMENT})"),
    FixKindSpec(FixKind.ADVICE, False, _parse_whole, _whole, _apply_advice, _render_set,
                acts=False),
    FixKindSpec(FixKind.PARSER_EXIT, False, _parse_whole, _whole, _apply_parser_exit,
                _render_exit(EXIT_USAGE)),
)}
