"""The outcome vocabulary (common/outcomes.py): phases, fix kinds and give-up causes as enums.

The give-up label of the metrics and /status comes from the cause the machine journals with
the give-up, never from the message's wording; a held worker shows `held`.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_guard.common.outcomes import FixKind, GiveUpCause, Phase
from sglang_guard.config.guardconfig import StartSection
from sglang_guard.rules.fixes import FIX_KINDS
from sglang_guard.status import status as model
from sglang_guard.status.shell.metrics import Metrics
from sglang_guard.supervise import machine
from sglang_guard.supervise.actions import Journal
from sglang_guard.supervise.events import ChildLine
from support.machinerun import Run, make_env
from support.pack import DRAFT_LINE, GIVE_UP_LINE
from support.records import typed


def _machine_phases() -> set[str]:
    """Every phase the machine's source sets (`phase="..."`)."""
    tree = ast.parse(Path(machine.__file__).read_text())
    found = {kw.value.value for node in ast.walk(tree) if isinstance(node, ast.Call)
             for kw in node.keywords
             if kw.arg == "phase" and isinstance(kw.value, ast.Constant)}
    return {p for p in found if isinstance(p, str)}


def test_every_phase_the_machine_sets_is_a_phase_and_shows_as_a_status_phase() -> None:
    phases = _machine_phases()
    assert {"starting", "ready", "held", "done"} <= phases
    assert phases | {"idle"} <= {p.value for p in Phase}  # idle: the State default
    for phase in Phase:
        assert model.phase_of(phase, None) in model.PHASES, phase


def test_a_held_worker_reads_1_for_held_and_0_elsewhere() -> None:
    snap = model.on_phase(model.Snapshot(), Phase.HELD, 1.0)
    assert snap.phase == "held"
    metrics = Metrics(lambda: 0.0)
    metrics.show(snap)
    series = {s.labels["phase"]: s.value
              for family in text_string_to_metric_families(metrics.exposition().decode())
              if family.name == "sglang_guard_phase" for s in family.samples}
    assert series["held"] == 1
    assert sum(series.values()) == 1


def test_fix_kinds_are_the_rule_packs_actions_and_causes_the_metric_labels() -> None:
    assert list(FIX_KINDS) == list(FixKind)
    assert [c.value for c in GiveUpCause] == list(model.GIVE_UP_REASONS)


# -- the give-up cause, from each place the machine gives up ------------------------------


def _crash_loop() -> Run:
    run = Run(env=make_env(max_failures=2))
    run.start()
    run.exited(1)
    run.backoff_then_spawn()
    run.exited(1)
    return run


def _fix_not_held() -> Run:
    run = Run()
    run.start()
    run.line(DRAFT_LINE)
    run.exited(1)
    run.line(DRAFT_LINE)  # again, after its fix, and nothing ever reached ready
    run.exited(1)
    return run


def _rule() -> Run:
    run = Run()
    run.start()
    run.line(GIVE_UP_LINE)
    run.exited(1)
    return run


def _stalled() -> Run:
    env = make_env()
    run = Run(env=replace(env, start=StartSection(on_stall="give_up")))
    run.start()
    run.tick(f"{machine.STALL}{run.state.stall_seq}")
    run.exited(1)
    return run


def _repeated_crash() -> Run:
    run = Run(env=make_env(max_failures=9))
    run.start()
    crash = "RuntimeError: CUDA error: an illegal memory access was encountered"
    for _ in range(2):  # the same crash line twice, with the same command line
        run.send(ChildLine(run.gen, "stderr", crash, len(crash), True, exception=True))
        run.exited(1)
        if run.state.phase == "backoff":
            run.backoff_then_spawn()
    return run


HISTORIES = {GiveUpCause.CRASH_LOOP: _crash_loop, GiveUpCause.FIX_NOT_HELD: _fix_not_held,
             GiveUpCause.RULE: _rule, GiveUpCause.STALLED: _stalled,
             GiveUpCause.REPEATED_CRASH: _repeated_crash}


def _records(run: Run) -> list[dict[str, Any]]:
    return [a.record.to_record() for a in run.log if isinstance(a, Journal)]


def _label(records: list[dict[str, Any]]) -> str | None:
    snap, label = model.Snapshot(), None
    for t, record in enumerate(records):
        snap, counts = model.on_record(snap, typed(record), float(t), 1000.0 + t)
        label = counts.give_up or label
    return label


REWORDINGS = [str.upper, str.capitalize, lambda s: "", lambda s: "Crash loop: " + s[::-1],
              lambda s: s.replace("fired again", "came back").replace("stall", "hang")]


@pytest.mark.parametrize("cause", list(HISTORIES))
def test_the_machine_journals_the_give_up_with_its_cause(cause: GiveUpCause) -> None:
    run = HISTORIES[cause]()
    give_ups = [r for r in _records(run) if r["event"] == "give_up"]
    assert len(give_ups) == 1, _records(run)
    assert give_ups[0]["cause"] == cause.value
    assert _label(_records(run)) == cause.value


@pytest.mark.parametrize("cause", list(HISTORIES))
@pytest.mark.parametrize("reword", range(len(REWORDINGS)))
def test_changing_a_messages_wording_changes_no_label(cause: GiveUpCause, reword: int) -> None:
    records = _records(HISTORIES[cause]())
    reworded = [{**r, "reason": REWORDINGS[reword](str(r.get("reason", "")))}
                if "reason" in r else r for r in records]
    assert _label(reworded) == cause.value


def test_a_cause_not_known_reads_as_other() -> None:
    # what a peer sends (a leader's exit cause) is read with `of`: never an error
    assert GiveUpCause.of("no-such") is GiveUpCause.OTHER
    assert GiveUpCause.of(None) is GiveUpCause.OTHER
    assert _label([{"event": "give_up", "reason": "crash loop: 3 failures",
                    "cause": "other"}]) == "other"


def test_a_worker_line_after_held_is_ignored_and_held_stays_held() -> None:
    run = Run(env=replace(make_env(), role="worker"))
    run.start()
    run.exited(1)
    assert run.state.phase == Phase.HELD
    run.send(ChildLine(run.gen, "stderr", "late", 4))
    assert model.phase_of(run.state.phase, None) == "held"
