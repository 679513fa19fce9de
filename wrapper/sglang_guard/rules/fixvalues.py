"""The values a rule's fix sets, as read from its pack once: `Literal | Scale | Above | FreePort`.

Pure: no I/O. rules/rulepack.py reads each rule's `new_value` into one of these (through the
kind's parse in rules/fixes.py `FIX_KINDS`); rules/fixes.py plans the value from it on a match.
Nothing here knows a `Rule`, so rules/rule.py can hold these and rules/fixes.py can name a
`Rule`, and no import goes round.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from sglang_guard.common.outcomes import FixKind
from sglang_guard.common.record import record
from sglang_guard.config.tomlread import Table

# A pattern's named group `current` (e.g. "under --mem-fraction-static=(?P<current>[0-9.]+)")
# is the value SGLang ran with: the base of `scale:F` when the flag is not on the command line.
CURRENT_GROUP = "current"
# `above:G` sets the flag this much above the number SGLang names (then caps it).
ABOVE_STEP = 0.01
SCALE = "scale:"
ABOVE = "above:"
FREE_PORT = "free_port"


def number(text: str | None) -> float | None:
    """A finite float, or None (for values in rule packs and on command lines)."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


# --- the forms of new_value ------------------------------------------------------------------


@record
class Literal:
    """`new_value = "fa3"`: the flag is set to this text."""

    text: str

    def value(self) -> str:
        return self.text


@record
class Scale:
    """`new_value = "scale:F"`: the flag's value times `factor`, clamped."""

    text: str  # as the pack spells it ("scale:0.9")
    factor: float
    default: str | None = None  # the value assumed when neither the flag nor the line has one
    minimum: float | None = None
    maximum: float | None = None

    def value(self, current: str | None, seen: str | None = None) -> str | None:
        """Applied to `current` (else the number the log names, `seen`, else the default)."""
        # A number the log names may end a sentence ("...=0.88."): the dot is not part of it.
        # One that does not parse gives way to the rule's default, as an absent flag does.
        seen = seen.rstrip(".") if seen is not None else None
        if current is None and number(seen) is None:
            seen = None
        base_text = current if current is not None else seen if seen is not None else self.default
        base = number(base_text)
        if base_text is None or base is None:
            return None
        value = base * self.factor
        if self.minimum is not None:
            value = max(value, self.minimum)
        if self.maximum is not None:
            value = min(value, self.maximum)
        if base.is_integer() and "." not in base_text and "e" not in base_text.lower():
            return str(max(1, int(value)))  # a count (a batch size) stays a whole number >= 1
        return format(round(value, 4), "g")


@record
class Above:
    """`new_value = "above:G"`: just above the number the pattern's group G captures."""

    text: str
    group: str
    maximum: float | None = None  # the cap

    def value(self, caps: Mapping[str, str], current: str | None) -> str | None:
        """The new value; None when that is no raise (past the cap, or not above `current`)."""
        floor = number((caps.get(self.group) or "").rstrip("."))
        if floor is None:
            return None
        value = round(floor + ABOVE_STEP, 3)
        if self.maximum is not None and value > self.maximum:
            return None  # SGLang needs more than the cap allows: no fix, rather than a futile one
        old = number(current.rstrip(".") if current is not None else None)
        if old is not None and old >= value:
            return None  # never the wrong direction
        return format(value, "g")


@record
class FreePort:
    """`new_value = "free_port"` or `"free_port:G"`: a port the shell picks at the next launch."""

    text: str
    group: str = ""  # the pattern's group naming the busy port ("": none)


NewValue = Literal | Scale | Above | FreePort


@record
class RuleFields:
    """What a rule pack says about one rule's fix, as read (before it is a `Rule`)."""

    kind: FixKind
    flags: tuple[str, ...]
    new_value: str | None
    groups: Collection[str]  # the pattern's named groups
    default: str | None
    minimum: float | None
    maximum: float | None
    reason: str


def parse_value(chk: Table, fields: RuleFields) -> NewValue | None:
    """`new_value` as a typed value; a ConfigError (key `new_value` or `default`) if it is bad."""
    text, default, minimum, maximum = (fields.new_value, fields.default, fields.minimum,
                                       fields.maximum)
    if text is not None and text.startswith(ABOVE):
        group = text[len(ABOVE):]
        if group not in fields.groups:
            raise chk.fail("new_value", f"{text!r}: the pattern has no group (?P<{group}>...)")
        if default is not None or minimum is not None:
            raise chk.fail("default", "above:G takes only a maximum (the cap)")
        return Above(text, group, maximum)
    if text is not None and text.split(":", 1)[0] == FREE_PORT:
        group = text.partition(":")[2]
        if fields.kind != FixKind.SET_FLAG:
            raise chk.fail("new_value", f"{FREE_PORT} goes with action set_flag only")
        if group and group not in fields.groups:
            raise chk.fail("new_value", f"{text!r}: the pattern has no group (?P<{group}>...)")
        if default is not None or minimum is not None or maximum is not None:
            raise chk.fail("default", f"{FREE_PORT} takes no default/minimum/maximum")
        return FreePort(text, group)
    if text is None or not text.startswith(SCALE):
        if default is not None or minimum is not None or maximum is not None:
            raise chk.fail(
                "default", "default/minimum/maximum only go with new_value 'scale:F' or 'above:G'"
            )
        return None if text is None else Literal(text)
    try:
        factor = float(text[len(SCALE):])
    except ValueError:
        raise chk.fail("new_value", f"{text!r}: the factor is not a number") from None
    if not (math.isfinite(factor) and factor > 0):
        raise chk.fail("new_value", f"{text!r}: the factor must be finite and > 0")
    if default is not None and number(default) is None:
        raise chk.fail("default", f"{default!r} is not a number")
    if minimum is not None and maximum is not None and minimum > maximum:
        raise chk.fail("minimum", "minimum is above maximum")
    return Scale(text, factor, default, minimum, maximum)


# --- a planned fix -------------------------------------------------------------------------
