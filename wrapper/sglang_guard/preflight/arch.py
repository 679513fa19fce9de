"""Classify a model's attention architecture exactly as SGLang 0.5.23 does.

The decision is data (`configs/attention-arch.toml`, read from SGLang's model_config.py):
an ordered list of rules over `architectures`, each optionally testing one field of the
text config. This module only evaluates it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, cast

from sglang_guard.common.record import record
from sglang_guard.config.tomlread import Table
from sglang_guard.errors import ConfigError
from sglang_guard.preflight.facts import AttentionArch

FieldTest = Literal["not_null", "truthy_or_missing"]
_MISSING = object()


@record
class ArchRule:
    """If any of `any_of` is among the architectures (and the field test holds): `arch`."""

    arch: AttentionArch
    any_of: frozenset[str]
    field: str | None = None
    test: FieldTest | None = None
    lines: str = ""

    def matches(self, architectures: Sequence[str], text_fields: Mapping[str, Any]) -> bool:
        """SGLang's `"X" in hf_config.architectures and <field test>`."""
        if not self.any_of.intersection(architectures):
            return False
        if self.field is None:
            return True
        value = text_fields.get(self.field, _MISSING)
        if self.test == "not_null":
            return value is not _MISSING and value is not None
        return value is _MISSING or bool(value)


@record
class ArchTable:
    """The ordered rules, the draft renames, and the SGLang version they were read from."""

    sglang_version: str
    rules: tuple[ArchRule, ...]
    draft_renames: Mapping[str, str]
    default: AttentionArch = "mha"


def parse_arch_table(text: str, path: str) -> ArchTable:
    """Parse `attention-arch.toml`; errors name the file and the key (unknown keys too)."""
    # A typo in a rule must fail loudly: a silently ignored `when` would misclassify models.
    root = Table.parse(text, path)
    root.known({"meta", "rules", "draft_renames"})
    raw_rules = root.get("rules", list, [], name="an array of tables ([[rules]])")
    rules = [_rule(root.child(f"rules[{n}]", raw)) for n, raw in enumerate(raw_rules)]
    meta = root.table("meta")
    meta.known({"sglang_version", "source", "default"})
    version = meta.must("sglang_version")
    default = cast("AttentionArch", meta.choice("default", ("mla", "mha", "ssm"), "mha"))
    renames = root.table("draft_renames")
    if not all(isinstance(v, str) for v in renames.data.values()):
        raise root.fail("draft_renames", "values must be architecture names")
    return ArchTable(version, tuple(rules), dict(renames.data), default)


def _rule(raw: Table) -> ArchRule:
    raw.known({"arch", "any_of", "when", "lines"})
    arch = cast("AttentionArch", raw.choice("arch", ("mla", "mha", "ssm")))
    names = raw.strings("any_of", required=True)
    if not names:
        raise raw.fail("any_of", "must be a non-empty list of strings")
    when = raw.table("when")
    when.known({"field", "test"})
    test = cast("FieldTest | None", when.choice("test", ("not_null", "truthy_or_missing"))
                if when.data else None)
    fld = when.must("field") if when.data else None
    return ArchRule(arch, frozenset(names), fld, test, str(raw.data.get("lines", "")))


def draft_architectures(table: ArchTable, architectures: Sequence[str]) -> tuple[str, ...]:
    """The architectures SGLang gives a draft model (it renames only the first entry)."""
    archs = list(architectures)
    if archs and archs[0] in table.draft_renames:
        archs[0] = table.draft_renames[archs[0]]
    return tuple(archs)


def classify(
    table: ArchTable, architectures: Sequence[str], text_fields: Mapping[str, Any]
) -> AttentionArch:
    """MLA, MHA or SSM for these (already draft-renamed) architectures."""
    for rule in table.rules:
        if rule.matches(architectures, text_fields):
            return rule.arch
    return table.default


def for_release(table: ArchTable, release: str, *, mla: Sequence[str],
                mla_conditional: Sequence[str], mha: Sequence[str], ssm: Sequence[str],
                draft_renames: Mapping[str, str]) -> ArchTable:
    """`table` (read from one release) as another release's model_config.py lists have it.

    A name keeps its rule only where that release's list has it; a name that release lists
    as MLA without a condition gets an unconditional rule (Pixtral was MLA outright in 0.5.10);
    anything else falls to the default (MHA), as SGLang's own lists do.
    """
    lists = {"mla": set(mla) | set(mla_conditional), "mha": set(mha), "ssm": set(ssm)}
    rules = []
    for rule in table.rules:
        names = rule.any_of & lists[rule.arch]
        if rule.arch == "mla" and rule.field is not None:
            names &= set(mla_conditional)
        if names:
            rules.append(replace(rule, any_of=frozenset(names)))
    covered = {n for r in rules if r.arch == "mla" and r.field is None for n in r.any_of}
    extra = set(mla) - covered
    if extra:
        rules.insert(0, ArchRule("mla", frozenset(extra), lines=f"{release} model_config.py"))
    return ArchTable(release, tuple(rules), dict(draft_renames), table.default)


def load_default_arch_table() -> ArchTable:
    """The shipped table (`configs/attention-arch.toml`)."""
    from sglang_guard.resources import config_path  # noqa: PLC0415 - keeps core import-light

    path = config_path("attention-arch.toml")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), None, f"cannot read: {exc}") from exc
    return parse_arch_table(text, str(path))
