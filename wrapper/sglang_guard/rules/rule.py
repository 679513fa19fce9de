"""A rule pack's rules as frozen values: when each may act and the fix it asks for.

Pure data: rules/rulepack.py builds these from a pack's TOML (validating it); rules/rules.py
matches them; rules/fixes.py plans and applies their fixes.
"""

from __future__ import annotations

from dataclasses import field

from sglang_guard.common.outcomes import FixKind
from sglang_guard.common.record import record
from sglang_guard.rules.fixvalues import NewValue

# When a rule acts: before SGLang is ready ("start", the default: most failures are a start
# that cannot work), after it ("running"), or both ("any").
PHASES = ("start", "running", "any")

@record
class Conditions:
    """When a rule may act. Unknown facts (arch, SM, version) never exclude a rule."""

    arch: tuple[str, ...] = ()  # allowed attention archs; empty: any
    sm_min: int | None = None
    sm_max: int | None = None
    sglang: str | None = None  # a PEP 440 specifier set, e.g. ">=0.5.23,<0.6"
    # flag -> True (present), False (absent), or the values it must have.
    flags: tuple[tuple[str, bool | tuple[str, ...]], ...] = ()


@record
class Rule:
    """One log pattern and the fix it asks for."""

    id: str
    pattern: str
    action: FixKind  # what it does (rules/fixes.py FIX_KINDS)
    flags: tuple[str, ...] = ()
    values: tuple[str, ...] | None = None
    new_value: NewValue | None = None  # parsed once, here (rules/fixes.py)
    conditions: Conditions = field(default_factory=Conditions)
    max_fires: int = 1
    fatal: bool = True
    reason: str = ""
    source: str | None = None
    pack: str = ""
    # Higher wins when one line matches several rules; a catch-all (a crash banner printed
    # before the real cause) sits below zero so that the specific rule is preferred.
    priority: int = 0
    phase: str = "start"  # one of PHASES
    # From an error-dataset record (`rules import`): its id, and what a person should read.
    record: str | None = None
    explanation: str = ""
    solutions: tuple[str, ...] = ()
    prevention: tuple[str, ...] = ()


@record
class RulePack:
    """A validated rule pack."""

    name: str
    path: str
    sglang_versions: str
    rules: tuple[Rule, ...]
