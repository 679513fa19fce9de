"""Rule packs (`configs/rules/*.toml`) as frozen values, and their validating parser.

Matching a log line against the rules is `rules/rules.py`; this module only reads packs.
Patterns are RE2 (`google-re2`): a pattern RE2 cannot compile (a backreference, a
lookaround) is rejected here, with the rule id in the message.
"""

from __future__ import annotations

from typing import Any

import re2
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from sglang_guard.common.outcomes import FixKind
from sglang_guard.config.tomlread import Table
from sglang_guard.errors import ConfigError
from sglang_guard.preflight.facts import ATTENTION_ARCHS
from sglang_guard.resources import config_path
from sglang_guard.rules.fixes import FIX_KINDS, RuleFields
from sglang_guard.rules.rule import PHASES, Conditions, Rule, RulePack

# The rules' data lives in rules/rule.py (so rules/fixes.py can name a `Rule` without importing
# this parser); its names are this module's too, where every reader of a pack finds them.
__all__ = [
    "PHASES",
    "RE2_OPTIONS",
    "Conditions",
    "Rule",
    "RulePack",
    "compile_pattern",
    "load_default_pack",
    "load_default_packs",
    "parse_pack",
]

RE2_OPTIONS = re2.Options()
RE2_OPTIONS.log_errors = False  # a bad pattern becomes a ConfigError, not stderr noise


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
        groups = compile_pattern(pattern).groupindex
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise chk.fail("pattern", f"not a valid RE2 pattern: {detail}") from None
    action = chk.get("action", str)
    if action not in FIX_KINDS:
        raise chk.fail("action", f"{action!r} is not one of {', '.join(FIX_KINDS)}")
    kind = FixKind(action)
    flags = chk.strings("flags") or ()
    for flag in flags:
        _check_flag(chk, "flags", flag)
    max_fires = chk.get("max_fires", int, 1)
    if max_fires < 1:
        raise chk.fail("max_fires", "must be at least 1")
    minimum, maximum = chk.get("minimum", (int, float)), chk.get("maximum", (int, float))
    reason = chk.get("reason", str, "")
    # The kind's own checks, and new_value read once into its typed form (rules/fixes.py).
    fields = RuleFields(kind, flags, chk.get("new_value", str), groups, chk.get("default", str),
                        None if minimum is None else float(minimum),
                        None if maximum is None else float(maximum), reason)
    new_value = FIX_KINDS[kind].parse(chk, fields)
    return Rule(
        id=rid,
        pattern=pattern,
        action=kind,
        flags=flags,
        values=chk.strings("values"),
        new_value=new_value,
        conditions=_parse_conditions(chk),
        max_fires=max_fires,
        fatal=chk.get("fatal", bool, True),
        reason=reason,
        source=chk.get("source", str),
        pack=pack,
        priority=chk.get("priority", int, 0),
        phase=chk.choice("phase", PHASES, "start"),
        record=chk.get("record", str),
        explanation=chk.get("explanation", str, ""),
        solutions=chk.strings("solutions") or (),
        prevention=chk.strings("prevention") or (),
    )


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
