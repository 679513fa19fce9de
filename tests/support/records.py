"""Journal records (dicts, as the journal file holds them) turned into the typed events of
common/outcomes.py: the tests write histories as records, the code takes events.

`typed(record, strict=True)` is how tests/unit/test_journal_events.py checks that every
recorded shape is one event's `to_record()`: the record's keys must be exactly that event's
fields. Without `strict`, a field the record leaves out takes a neutral value (a test that
writes only what the fold reads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sglang_guard.common import outcomes
from sglang_guard.common.outcomes import (
    FleetChange,
    FleetChanged,
    FleetFix,
    GaveUp,
    GiveUpCause,
    JournalEvent,
    LogFix,
    PreflightFinding,
    UndoFix,
)


def event_classes() -> list[type[JournalEvent]]:
    """Every journal event class common/outcomes.py defines."""
    return [c for c in vars(outcomes).values()
            if isinstance(c, type) and issubclass(c, JournalEvent) and c is not JournalEvent]


def kind_of(record: Mapping[str, Any]) -> type[JournalEvent]:
    """The event class whose records look like `record`."""
    event = str(record.get("event"))
    if event == "remediated":
        trigger = record.get("trigger", "log")
        if trigger == "preflight":
            return PreflightFinding
        if trigger == "fleet":
            return FleetFix
        return UndoFix if record.get("action") == "undo" else LogFix
    if event.startswith("preflight."):
        return PreflightFinding
    if event in {c.value for c in FleetChange}:
        return FleetChanged
    found = [c for c in event_classes() if event == c.EVENT]
    assert len(found) == 1, f"no one event class for {event!r}: {found}"
    return found[0]


def _neutral(f: dataclasses.Field[Any]) -> Any:
    kind = str(f.type)
    for prefix, value in (("GiveUpCause", GiveUpCause.OTHER), ("int", 0), ("float", 0.0),
                          ("str", ""), ("bool", False), ("Sequence", []), ("Mapping", {})):
        if kind.startswith(prefix):
            return value
    return None


def typed(record: Mapping[str, Any], *, strict: bool = False) -> JournalEvent:
    """The event `record` is the journal record of."""
    cls = kind_of(record)
    by_key = {cls.KEYS.get(f.name, f.name): f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in record.items():
        if key == "event":
            continue
        if key in by_key:
            kwargs[by_key[key].name] = value
        else:
            extra[key] = value
    if cls is FleetChanged:
        kwargs["change"] = FleetChange(record["event"])
        kwargs["more"], extra = extra, {}
    if cls is GaveUp and "cause" in kwargs:
        kwargs["cause"] = GiveUpCause(kwargs["cause"])
    missing = [f for f in dataclasses.fields(cls) if f.name not in kwargs
               and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if strict:
        assert not extra, f"{record.get('event')}: keys no field of {cls.__name__} holds: {extra}"
        assert not missing, f"{record.get('event')}: {cls.__name__} needs {missing}"
    for f in missing:
        kwargs[f.name] = _neutral(f)
    return cls(**kwargs)
