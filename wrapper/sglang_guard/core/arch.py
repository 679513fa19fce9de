"""Classify a model's attention architecture exactly as SGLang 0.5.23 does.

The decision is data (`configs/attention-arch.toml`, read from SGLang's model_config.py):
an ordered list of rules over `architectures`, each optionally testing one field of the
text config. This module only evaluates it.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sglang_guard.core.facts import AttentionArch
from sglang_guard.errors import ConfigError

FieldTest = Literal["not_null", "truthy_or_missing"]
_MISSING = object()


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class ArchTable:
    """The ordered rules, the draft renames, and the SGLang version they were read from."""

    sglang_version: str
    rules: tuple[ArchRule, ...]
    draft_renames: Mapping[str, str]
    default: AttentionArch = "mha"


def parse_arch_table(text: str, path: str) -> ArchTable:
    """Parse `attention-arch.toml`; errors name the file and the key (unknown keys too)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, None, f"not valid TOML: {exc}") from exc
    _known(path, "", data, {"meta", "rules", "draft_renames"})
    raw_rules = data.get("rules", [])
    if not isinstance(raw_rules, list):
        raise ConfigError(path, "rules", "must be an array of tables ([[rules]])")
    rules = [_rule(path, f"rules[{n}]", raw) for n, raw in enumerate(raw_rules)]
    meta = _table(path, "meta", data.get("meta", {}))
    _known(path, "meta.", meta, {"sglang_version", "source", "default"})
    version = meta.get("sglang_version")
    if not isinstance(version, str):
        raise ConfigError(path, "meta.sglang_version", "must name the SGLang version read")
    default = meta.get("default", "mha")
    if default not in ("mla", "mha", "ssm"):
        raise ConfigError(path, "meta.default", f"must be mla, mha or ssm, not {default!r}")
    renames = _table(path, "draft_renames", data.get("draft_renames", {}))
    if not all(isinstance(v, str) for v in renames.values()):
        raise ConfigError(path, "draft_renames", "values must be architecture names")
    return ArchTable(version, tuple(rules), dict(renames), default)


def _rule(path: str, key: str, raw: Any) -> ArchRule:
    raw = _table(path, key, raw)
    _known(path, f"{key}.", raw, {"arch", "any_of", "when", "lines"})
    arch = raw.get("arch")
    if arch not in ("mla", "mha", "ssm"):
        raise ConfigError(path, f"{key}.arch", f"must be mla, mha or ssm, not {arch!r}")
    names = raw.get("any_of")
    if not isinstance(names, list) or not names or not all(isinstance(x, str) for x in names):
        raise ConfigError(path, f"{key}.any_of", "must be a non-empty list of strings")
    when = _table(path, f"{key}.when", raw.get("when", {}))
    _known(path, f"{key}.when.", when, {"field", "test"})
    test, fld = when.get("test"), when.get("field")
    if when and test not in ("not_null", "truthy_or_missing"):
        raise ConfigError(path, f"{key}.when.test", f"unknown test {test!r}")
    if when and not isinstance(fld, str):
        raise ConfigError(path, f"{key}.when.field", "must name a field of the text config")
    return ArchRule(arch, frozenset(names), fld, test, str(raw.get("lines", "")))


def _table(path: str, key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(path, key, f"must be a table, not {type(value).__name__}")
    return value


def _known(path: str, prefix: str, data: Mapping[str, Any], allowed: set[str]) -> None:
    # A typo in a rule must fail loudly: a silently ignored `when` would misclassify models.
    for key in data:
        if key not in allowed:
            raise ConfigError(path, f"{prefix}{key}",
                              f"unknown key (expected one of: {', '.join(sorted(allowed))})")


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


def load_default_arch_table() -> ArchTable:
    """The shipped table (`configs/attention-arch.toml`)."""
    from sglang_guard.resources import config_path  # noqa: PLC0415 - keeps core import-light

    path = config_path("attention-arch.toml")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), None, f"cannot read: {exc}") from exc
    return parse_arch_table(text, str(path))
