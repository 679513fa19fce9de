"""Rule packs (`configs/rules/*.toml`) as frozen values, and their validating parser.

Matching a log line against the rules is `core/rules.py`; this module only reads packs.
Patterns are RE2 (`google-re2`): a pattern RE2 cannot compile (a backreference, a
lookaround) is rejected here, with the rule id in the message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import re2
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from sglang_guard.core.facts import ATTENTION_ARCHS
from sglang_guard.core.tomlread import Table
from sglang_guard.errors import ConfigError
from sglang_guard.resources import config_path

# "environment": give up at once with EXIT_ENVIRONMENT: a broken install (a kernel library
# built for another torch, a CUDA library missing, a GPU the build has no code for) that no
# restart and no flag fixes. "advice": no automatic action; the guard shows the rule's
# explanation and solutions. "parser_exit": end the guard with exit 2 at once: SGLang's own
# parser rejected the command line (a usage error), which no relaunch of it changes.
ACTIONS = ("drop_flag", "set_flag", "rewrite_value", "restart", "give_up", "undo_guard_edit",
           "environment", "advice", "parser_exit")
FLAG_ACTIONS = ("drop_flag", "set_flag", "rewrite_value")
SCALE = "scale:"
# When a rule acts: before SGLang is ready ("start", the default: most failures are a start
# that cannot work), after it ("running"), or both ("any").
PHASES = ("start", "running", "any")
ABOVE = "above:"
# A pattern's named group `current` (e.g. "under --mem-fraction-static=(?P<current>[0-9.]+)")
# is the value SGLang ran with: the base of `scale:F` when the flag is not on the command line.
CURRENT_GROUP = "current"
# `free_port` (or `free_port:G`): set the flag to a port the shell finds free just before the
# next launch (the core picks no port: it has no sockets). With `:G`, the pattern's named
# group G is the busy port SGLang names, and a flag on the command line is changed only when
# it holds that port (another flag's port in use is no business of this rule).
FREE_PORT = "free_port"


def free_port_group(new_value: str | None) -> str | None:
    """For `free_port:G`, G; for a bare `free_port`, ""; for any other new_value, None."""
    if new_value is None or new_value.split(":", 1)[0] != FREE_PORT:
        return None
    return new_value.partition(":")[2]

RE2_OPTIONS = re2.Options()
RE2_OPTIONS.log_errors = False  # a bad pattern becomes a ConfigError, not stderr noise


@dataclass(frozen=True, slots=True)
class Conditions:
    """When a rule may act. Unknown facts (arch, SM, version) never exclude a rule."""

    arch: tuple[str, ...] = ()  # allowed attention archs; empty: any
    sm_min: int | None = None
    sm_max: int | None = None
    sglang: str | None = None  # a PEP 440 specifier set, e.g. ">=0.5.23,<0.6"
    # flag -> True (present), False (absent), or the values it must have.
    flags: tuple[tuple[str, bool | tuple[str, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class Rule:
    """One log pattern and the fix it asks for."""

    id: str
    pattern: str
    action: str
    flags: tuple[str, ...] = ()
    values: tuple[str, ...] | None = None
    new_value: str | None = None
    conditions: Conditions = field(default_factory=Conditions)
    max_fires: int = 1
    fatal: bool = True
    reason: str = ""
    source: str | None = None
    pack: str = ""
    # For "scale:F": the value assumed when the flag is absent, and the clamp of the result.
    default: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    # Higher wins when one line matches several rules; a catch-all (a crash banner printed
    # before the real cause) sits below zero so that the specific rule is preferred.
    priority: int = 0
    phase: str = "start"  # one of PHASES
    # From an error-dataset record (`rules import`): its id, and what a person should read.
    record: str | None = None
    explanation: str = ""
    solutions: tuple[str, ...] = ()
    prevention: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RulePack:
    """A validated rule pack."""

    name: str
    path: str
    sglang_versions: str
    rules: tuple[Rule, ...]


def number(text: str | None) -> float | None:
    """A finite float, or None (for values in rule packs and on command lines)."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


# --- parsing -------------------------------------------------------------------------------

_RULE_KEYS = frozenset(
    {
        "id",
        "pattern",
        "action",
        "flags",
        "values",
        "new_value",
        "when",
        "max_fires",
        "fatal",
        "reason",
        "source",
        "default",
        "minimum",
        "maximum",
        "priority",
        "phase",
        "record",
        "explanation",
        "solutions",
        "prevention",
    }
)
_WHEN_KEYS = frozenset({"arch", "sm_min", "sm_max", "sglang", "flags"})


def _check_flag(chk: Table, key: str, flag: str) -> None:
    if not (flag.startswith("--") and len(flag) > 2 and flag[2:].replace("-", "").isalnum()):
        raise chk.fail(key, f"{flag!r} is not a canonical long flag like '--attention-backend'")


def _check_specifier(chk: Table, key: str, spec: str) -> None:
    try:
        SpecifierSet(spec)
    except InvalidSpecifier as exc:
        raise chk.fail(key, f"not a version specifier: {exc}") from None


def compile_pattern(pattern: str) -> Any:
    """Compile an RE2 pattern; raises re2.error (backreferences, lookaround, bad syntax)."""
    return re2.compile(pattern, RE2_OPTIONS)


def _parse_conditions(chk: Table) -> Conditions:
    wc = chk.table("when")
    wc.known(_WHEN_KEYS)
    arch = wc.strings("arch") or ()
    for a in arch:
        if a not in ATTENTION_ARCHS:
            raise wc.fail("arch", f"{a!r} is not one of {', '.join(ATTENTION_ARCHS)}")
    sglang = wc.get("sglang", str)
    if sglang is not None:
        _check_specifier(wc, "sglang", sglang)
    flags: list[tuple[str, bool | tuple[str, ...]]] = []
    for flag, want in wc.get("flags", dict, {}).items():
        _check_flag(wc, "flags", flag)
        if isinstance(want, bool):
            flags.append((flag, want))
        elif isinstance(want, list) and want and all(isinstance(v, str) for v in want):
            flags.append((flag, tuple(want)))
        else:
            raise wc.fail(f"flags.{flag}", "expected true, false or a list of values")
    return Conditions(arch, wc.get("sm_min", int), wc.get("sm_max", int), sglang, tuple(flags))


def _check_new_value(chk: Table, rule: Rule) -> None:
    if rule.action in ("set_flag", "rewrite_value") and not rule.flags:
        raise chk.fail("flags", f"{rule.action} needs the flag(s) it changes")
    if rule.action == "rewrite_value" and rule.new_value is None:
        raise chk.fail("new_value", "rewrite_value needs a new_value")
    if rule.action not in ("set_flag", "rewrite_value") and rule.new_value is not None:
        raise chk.fail("new_value", f"{rule.action} takes no new_value")
    if rule.new_value is not None and rule.new_value.startswith(ABOVE):
        _check_above(chk, rule)
        return
    if free_port_group(rule.new_value) is not None:
        _check_free_port(chk, rule)
        return
    if rule.new_value is None or not rule.new_value.startswith(SCALE):
        if rule.default is not None or rule.minimum is not None or rule.maximum is not None:
            raise chk.fail(
                "default", "default/minimum/maximum only go with new_value 'scale:F' or 'above:G'"
            )
        return
    try:
        factor = float(rule.new_value[len(SCALE) :])
    except ValueError:
        raise chk.fail("new_value", f"{rule.new_value!r}: the factor is not a number") from None
    if not (math.isfinite(factor) and factor > 0):
        raise chk.fail("new_value", f"{rule.new_value!r}: the factor must be finite and > 0")
    if rule.default is not None and number(rule.default) is None:
        raise chk.fail("default", f"{rule.default!r} is not a number")
    if rule.minimum is not None and rule.maximum is not None and rule.minimum > rule.maximum:
        raise chk.fail("minimum", "minimum is above maximum")


def _check_above(chk: Table, rule: Rule) -> None:
    """`above:G`: a value just above the number the pattern's named group G captures."""
    assert rule.new_value is not None  # noqa: S101  (the caller checked)
    group = rule.new_value[len(ABOVE) :]
    if group not in compile_pattern(rule.pattern).groupindex:
        problem = f"{rule.new_value!r}: the pattern has no group (?P<{group}>...)"
        raise chk.fail("new_value", problem)
    if rule.default is not None or rule.minimum is not None:
        raise chk.fail("default", "above:G takes only a maximum (the cap)")


def _check_free_port(chk: Table, rule: Rule) -> None:
    """`free_port[:G]`: only set_flag, G a named group of the pattern, nothing to clamp."""
    group = free_port_group(rule.new_value)
    if rule.action != "set_flag":
        raise chk.fail("new_value", f"{FREE_PORT} goes with action set_flag only")
    if group and group not in compile_pattern(rule.pattern).groupindex:
        problem = f"{rule.new_value!r}: the pattern has no group (?P<{group}>...)"
        raise chk.fail("new_value", problem)
    if rule.default is not None or rule.minimum is not None or rule.maximum is not None:
        raise chk.fail("default", f"{FREE_PORT} takes no default/minimum/maximum")


def _parse_rule(path: str, pack: str, index: int, table: Any) -> Rule:
    if not isinstance(table, dict):
        raise ConfigError(path, f"rules[{index}]", "expected a table")
    rid = table.get("id")
    if not isinstance(rid, str) or not rid:
        raise ConfigError(path, f"rules[{index}].id", "missing or not a non-empty string")
    chk = Table(path, f"rules[{rid}]", table)
    chk.known(_RULE_KEYS)
    pattern = chk.get("pattern", str)
    if not pattern:
        raise chk.fail("pattern", "missing or empty")
    try:
        compile_pattern(pattern)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise chk.fail("pattern", f"not a valid RE2 pattern: {detail}") from None
    action = chk.get("action", str)
    if action not in ACTIONS:
        raise chk.fail("action", f"{action!r} is not one of {', '.join(ACTIONS)}")
    flags = chk.strings("flags") or ()
    for flag in flags:
        _check_flag(chk, "flags", flag)
    if action == "drop_flag" and not flags:
        raise chk.fail("flags", "drop_flag needs the flag(s) it drops")
    if action not in FLAG_ACTIONS and flags:
        raise chk.fail("flags", f"{action} changes no flag")
    max_fires = chk.get("max_fires", int, 1)
    if max_fires < 1:
        raise chk.fail("max_fires", "must be at least 1")
    minimum, maximum = chk.get("minimum", (int, float)), chk.get("maximum", (int, float))
    rule = Rule(
        id=rid,
        pattern=pattern,
        action=action,
        flags=flags,
        values=chk.strings("values"),
        new_value=chk.get("new_value", str),
        conditions=_parse_conditions(chk),
        max_fires=max_fires,
        fatal=chk.get("fatal", bool, True),
        reason=chk.get("reason", str, ""),
        source=chk.get("source", str),
        pack=pack,
        default=chk.get("default", str),
        minimum=None if minimum is None else float(minimum),
        maximum=None if maximum is None else float(maximum),
        priority=chk.get("priority", int, 0),
        phase=chk.choice("phase", PHASES, "start"),
        record=chk.get("record", str),
        explanation=chk.get("explanation", str, ""),
        solutions=chk.strings("solutions") or (),
        prevention=chk.strings("prevention") or (),
    )
    if action == "environment" and not rule.reason:
        raise chk.fail("reason", "an environment rule needs the one-line diagnosis it gives")
    _check_new_value(chk, rule)
    return rule


def parse_pack(text: str, path: str) -> RulePack:
    """Parse and validate a rule pack; every problem is a ConfigError naming path and key."""
    doc = Table.parse(text, path)
    head = doc.table("pack")
    name = head.get("name", str)
    versions = head.get("sglang_versions", str)
    if not name:
        raise head.fail("name", "missing")
    if not versions:
        raise head.fail("sglang_versions", "missing (which SGLang versions was it read from?)")
    _check_specifier(head, "sglang_versions", versions)
    raw_rules = doc.get("rules", list, [], name="an array of tables ([[rules]])")
    rules = tuple(_parse_rule(path, name, i, t) for i, t in enumerate(raw_rules))
    seen: set[str] = set()
    for rule in rules:
        if rule.id in seen:
            raise ConfigError(path, f"rules[{rule.id}].id", "duplicate rule id")
        seen.add(rule.id)
    return RulePack(name=name, path=path, sglang_versions=versions, rules=rules)


def load_default_pack() -> RulePack:
    """The shipped pack, `configs/rules/default.toml` (reads one bundled file)."""
    path = config_path("rules", "default.toml")
    return parse_pack(path.read_text(encoding="utf-8"), str(path))


def load_default_packs() -> tuple[RulePack, ...]:
    """The shipped packs: `default.toml`, then `environment.toml` (broken installs)."""
    packs = [load_default_pack()]
    path = config_path("rules", "environment.toml")
    packs.append(parse_pack(path.read_text(encoding="utf-8"), str(path)))
    return tuple(packs)
