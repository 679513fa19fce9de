"""The journal's events as types (common/outcomes.py): the format the journal had, and names
that mypy checks.

Every record shape the guard wrote before its events were typed (tests/data/
journal-shapes.json: records from test runs, plus the shapes no run wrote, from the code)
is exactly one event's `to_record()`, keys and their order alike. A renamed event class or
field is an error under `mypy --strict`, not a record with another key.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.common import outcomes
from sglang_guard.common.outcomes import GiveUpCause, JournalEvent
from support.records import event_classes, kind_of, typed

REPO = Path(__file__).resolve().parents[2]
SHAPES = json.loads((REPO / "tests" / "data" / "journal-shapes.json").read_text())
RECORDS: list[dict[str, Any]] = [*SHAPES["recorded"], *SHAPES["from_source"]]


def _id(record: dict[str, Any]) -> str:
    return f"{record['event']}:{','.join(k for k in record if k != 'event')}"


@pytest.mark.parametrize("record", RECORDS, ids=_id)
def test_every_recorded_shape_is_one_events_record(record: dict[str, Any]) -> None:
    event = typed(record, strict=True)  # every key is a field of the event: none left over
    out = json.loads(json.dumps(event.to_record(), default=str))
    assert list(out.items()) == list(record.items())  # the same keys, values and order


def test_every_event_kind_has_a_recorded_shape() -> None:
    seen = {kind_of(r) for r in RECORDS}
    assert set(event_classes()) == seen, set(event_classes()) ^ seen


def test_the_shapes_were_written_by_the_guard() -> None:
    # recorded from real runs: the kinds the tiers' guards wrote, not only ones spelled here
    kinds = {kind_of(r).__name__ for r in SHAPES["recorded"]}
    assert {"ChildStarted", "LogFix", "PreflightFinding", "FleetFix", "GaveUp", "Ready",
            "BackingOff", "StartStalled", "ReloadApplied", "OrphansStopped", "NodeDown",
            "GroupRelaunched"} <= kinds


def test_give_up_names_a_cause_and_the_repeat_has_its_own() -> None:
    assert "cause" in {f for r in RECORDS if r["event"] == "give_up" for f in r}
    assert all("cause" in r for r in RECORDS if r["event"] == "give_up")
    causes = {r["cause"] for r in RECORDS if r["event"] == "give_up"}
    assert GiveUpCause.REPEATED_CRASH.value in causes


def test_every_event_is_a_frozen_value() -> None:
    for cls in event_classes():
        assert cls.__dataclass_params__.frozen, cls  # type: ignore[attr-defined]
        assert "__slots__" in cls.__dict__, cls
    assert JournalEvent().to_record() == {"event": ""}


GOOD = """
from sglang_guard.common.outcomes import GaveUp, GiveUpCause, StartStalled

a = GaveUp(reason="x", cause=GiveUpCause.CRASH_LOOP)
b = StartStalled(gen=1, stage="s", line="l", silent_s=1.0, limit_s=1.0, action="restart")
"""

BAD = """
from sglang_guard.common.outcomes import GaveUp, GiveUpCause, StartStaled

a = GaveUp(reason="x", why=GiveUpCause.CRASH_LOOP)
b = GaveUp(reason="x", cause="crash_loop")
"""


def test_mypy_strict_fails_on_a_renamed_event_or_field(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "bad.py").write_text(BAD)
    env = {**os.environ, "MYPYPATH": str(REPO / "wrapper")}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--follow-imports=silent",
         "--config-file=", "good.py", "bad.py"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert errors and all(line.startswith("bad.py:") for line in errors), out  # good.py passes
    assert any('"StartStaled"' in line for line in errors), out  # a renamed class
    assert any('"why"' in line for line in errors), out  # a renamed field
    assert any('"cause"' in line and "GiveUpCause" in line for line in errors), out  # a string


def test_the_outcomes_module_holds_every_kind_the_code_emits() -> None:
    # The record kinds are the classes' EVENTs (and the two whose name is computed).
    events = {c.EVENT for c in event_classes() if c.EVENT}
    assert {"child.start", "remediated", "restored", "crash.detected", "give_up.planned",
            "give_up", "backoff", "ready", "start.stage", "start.stalled",
            "group.node_down", "reload.applied", "reload.rejected"} <= events
    assert outcomes.PreflightFinding.EVENT == outcomes.FleetChanged.EVENT == ""


def test_no_module_spells_a_record_or_reads_one_back() -> None:
    # A record's `"event": ...` is written in common/outcomes.py alone, and no module reads a
    # record's `event` back (structlog's own `event` in common/shell/logsetup.py and SGLang's
    # request
    # records in rules/logline.py are not the journal's).
    others = {"common/outcomes.py", "common/shell/logsetup.py", "rules/logline.py"}
    shape = re.compile(r'"event"\s*:|\[\s*"event"\s*\]|\.get\(\s*"event"')
    package = REPO / "wrapper" / "sglang_guard"
    found = [f"{p.relative_to(package)}: {line.strip()}" for p in sorted(package.rglob("*.py"))
             if str(p.relative_to(package)) not in others
             for line in p.read_text().splitlines() if shape.search(line)]
    assert found == []
