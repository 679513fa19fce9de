"""What the status port shows: a snapshot folded from journal events and loop steps, no I/O.

The journal already records everything that happens; `on_record` matches each event's type
(common/outcomes.py, never a record dict or its wording) and turns it into
the next snapshot and the counts it adds (launches, restarts by cause, remediations,
give-ups, reloads, time to ready). Times come in as arguments. A start-hang watcher needs
no wiring of its own: journaling `start.stage` {stage} and `start.stalled` {stage, line}
sets the phase to `loading`, names the stage, and turns /startupz to 503.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, replace
from typing import Any

from sglang_guard.common.outcomes import (
    BackingOff,
    ChildExit,
    ChildStarted,
    CrashDetected,
    FixKind,
    FleetChange,
    FleetChanged,
    FleetError,
    FleetFix,
    FleetLookup,
    FleetRefused,
    GaveUp,
    GiveUpCause,
    GiveUpPlanned,
    GuardExit,
    JournalEvent,
    LogFix,
    PreflightFinding,
    Ready,
    ReloadApplied,
    ReloadRejected,
    Restored,
    StageStarted,
    StartStalled,
    StopCause,
    UndoFix,
)
from sglang_guard.common.record import record
from sglang_guard.sglang.redact import redact_text

# "held": a worker whose SGLang exited, waiting for its group's leader.
PHASES = ("preflight", "starting", "loading", "ready", "backoff", "stopping", "held", "stopped")
# Why a launch after the first one happened (the first is "start").
RESTART_CAUSES = ("crash", "liveness", "ready_timeout", "stalled", "reload", "fix")
LAUNCH_REASONS = ("start", *RESTART_CAUSES)
GIVE_UP_REASONS = tuple(c.value for c in GiveUpCause)  # the cause a give-up record names
RELOAD_OUTCOMES = ("applied", "restart", "rejected")
# Fleet memory (fleet/shell/fleet.py): lookups and what came of them, and the store writes.
FLEET_KINDS = ("lookup", "hit", "known_bad_skip", "refused", "publish", "confirm", "known_bad",
               "store_error")
_FLEET_LOOKUP = {"hit": ("hit",), "known_bad": ("known_bad_skip",), "miss": (),
                 "error": ("store_error",), "unavailable": ("store_error",)}
_FLEET_CHANGES = {FleetChange.PUBLISHED: ("publish",), FleetChange.CONFIRMED: ("confirm",),
                  FleetChange.KNOWN_BAD: ("known_bad",), FleetChange.SKIPPED: ()}
# The machine's Stop reasons that name the cause themselves (others come from records).
# "picking": the old tree is gone and the shell looks for a free port, just before a launch.
_MACHINE_PHASES = {"idle": "preflight", "done": "stopped", "picking": "starting"}


@record
class Snapshot:
    """The guard as the status port shows it."""

    phase: str = "preflight"
    since: float = 0.0  # monotonic time the phase began
    stage: str | None = None  # a loading stage, as a stage watcher names it
    stalled: str | None = None  # the stage that made no progress, once one did
    gave_up: str | None = None  # the one-line reason, once the guard gave up or refused
    generation: int = 0
    child_up: bool = False
    ready: bool = False
    started: bool = False  # SGLang was ready once: the start is over (/startupz)
    launched_at: float | None = None  # monotonic time of the current launch
    cause: str | None = None  # why the current launch is ending (the next one's reason)
    planned_rule: str | None = None  # a rule whose action is give_up fired
    last_remediation: Mapping[str, Any] | None = None
    backoff_until: float | None = None  # wall-clock time of the next launch
    argv: tuple[str, ...] = ()  # as journaled: masked already
    exit_code: int | None = None
    fleet_fix: Mapping[str, Any] | None = None  # the fleet entry the launch runs with


@record
class Counts:
    """What one record adds to the counters and the histogram."""

    launch: str | None = None
    restart: str | None = None
    remediation: tuple[str, str, str, str] | None = None  # trigger, rule, flag, action
    give_up: str | None = None
    reload: str | None = None
    time_to_ready: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    fleet: tuple[str, ...] = ()  # FLEET_KINDS this record counts


def phase_of(machine_phase: str, stage: str | None) -> str:
    """The status phase for a machine phase (a named stage while starting is `loading`)."""
    phase = _MACHINE_PHASES.get(machine_phase, machine_phase)
    return "loading" if phase == "starting" and stage else phase


def on_phase(snap: Snapshot, machine_phase: str, now: float) -> Snapshot:
    """The snapshot after a loop step left the machine in `machine_phase`."""
    phase = phase_of(machine_phase, snap.stage)
    if phase == snap.phase:
        return snap
    return replace(snap, phase=phase, since=now, ready=phase == "ready",
                   backoff_until=snap.backoff_until if phase == "backoff" else None)


def on_stop(snap: Snapshot, cause: StopCause | None) -> Snapshot:
    """A Stop the machine asked for: liveness, ready timeout and reload carry their cause
    (`StopCause`, set where the machine decides the stop; no wording is read)."""
    return replace(snap, cause=str(cause)) if cause is not None and snap.cause is None else snap


def on_stage(snap: Snapshot, stage: str | None, now: float) -> Snapshot:
    """A stage watcher saw SGLang enter `stage` (None: no stage known)."""
    snap = replace(snap, stage=stage)
    return replace(snap, phase="loading", since=now) if (
        stage and snap.phase == "starting") else snap


def on_stalled(snap: Snapshot, stage: str) -> Snapshot:
    """A stage watcher saw no progress within `stage`'s limit: /startupz answers 503."""
    return replace(snap, stalled=stage, cause=snap.cause or "stalled")


def on_record(snap: Snapshot, event: JournalEvent, now: float, wall: float
              ) -> tuple[Snapshot, Counts]:
    """Fold one journal event into the snapshot; what it adds to the counters."""
    match event:
        case ChildStarted(gen=gen, argv=argv):
            reason = "start" if gen <= 1 else (snap.cause or "crash")
            new = replace(snap, generation=gen, child_up=True, launched_at=now, cause=None,
                          stage=None, stalled=None, ready=False, backoff_until=None,
                          argv=tuple(str(a) for a in argv))
            return new, Counts(launch=reason, restart=None if reason == "start" else reason)
        case ChildExit():
            return replace(snap, child_up=False, ready=False, cause=snap.cause or "crash"
                           ), Counts()
        case Ready():
            took = now - snap.launched_at if snap.launched_at is not None else None
            return replace(snap, ready=True, started=True), Counts(time_to_ready=took)
        case PreflightFinding() if not event.is_fix:
            return snap, Counts()
        case LogFix() | UndoFix() | PreflightFinding() | FleetFix() | Restored():
            return _remediation(snap, event)
        case StageStarted(stage=stage):  # a stage watcher saw SGLang enter a loading stage
            return on_stage(snap, stage or None, now), Counts()
        case StartStalled(stage=stage):  # ... or saw no progress within the stage's limit
            return on_stalled(snap, stage or "unknown"), Counts()
        case CrashDetected():
            return replace(snap, cause="crash"), Counts()
        case GiveUpPlanned(rule=rule):
            return replace(snap, planned_rule=rule or None), Counts()
        case GaveUp(reason=reason, cause=cause):  # the cause is set where it is known
            return replace(snap, gave_up=reason), Counts(give_up=GiveUpCause(cause).value)
        case BackingOff(delay_s=delay):
            return replace(snap, backoff_until=wall + float(delay)), Counts()
        case ReloadApplied(restart=restart):
            return snap, Counts(reload="restart" if restart else "applied")
        case ReloadRejected():
            return snap, Counts(reload="rejected")
        case GuardExit(code=code):
            return replace(snap, exit_code=int(code)), Counts()
        case FleetLookup(result=result):
            return snap, Counts(fleet=("lookup", *_FLEET_LOOKUP.get(result, ())))
        case FleetRefused():
            return snap, Counts(fleet=("lookup", "refused"))
        case FleetError():
            return snap, Counts(fleet=("store_error",))
        case FleetChanged(change=change):
            if change == FleetChange.KNOWN_BAD:
                snap = replace(snap, fleet_fix=None)  # no longer in use: the guard goes on alone
            return snap, Counts(fleet=_FLEET_CHANGES[change])
    return snap, Counts()


# One action vocabulary for the metrics: a rule's (common/outcomes.py FixKind), which
# preflight's policy actions map onto (`drop` of preflight is a rule's `drop_flag`).
ACTION_LABELS = {"drop": FixKind.DROP_FLAG, "rewrite": FixKind.REWRITE_VALUE,
                 "set": FixKind.SET_FLAG}


def action_label(action: str) -> str:
    """The metrics' label for a remediation's action, whichever side journaled it."""
    return ACTION_LABELS.get(action, action)


def _fleet_fix(snap: Snapshot, event: FleetFix) -> Snapshot:
    """A fleet fix applied before the first launch: /status names its key, origin and edits."""
    edit = {"flag": event.flag, "action": event.action, "old_value": event.old_value,
            "new_value": event.new_value}
    old = snap.fleet_fix if snap.fleet_fix and snap.fleet_fix.get("key") == event.key \
        else None
    edits = [*(old["edits"] if old else []), edit]
    return replace(snap, fleet_fix={"key": event.key, "origin": event.origin, "edits": edits})


# What /status shows of the last remediation: these keys of its journal record.
_SHOWN = ("event", "trigger", "rule", "flag", "action", "old_value", "value", "new_value",
          "reason", "argv_before", "argv_after", "gen")


def _remediation(snap: Snapshot, event: LogFix | UndoFix | PreflightFinding | FleetFix | Restored
                 ) -> tuple[Snapshot, Counts]:
    trigger = "log" if isinstance(event, Restored) else event.trigger
    if isinstance(event, FleetFix):
        snap = _fleet_fix(snap, event)
    action = action_label("restore" if isinstance(event, Restored) else event.action)
    flag = None if isinstance(event, Restored) else event.flag
    labels = (trigger, event.rule, flag or "", action)
    record = event.to_record()  # /status shows the record as the journal has it
    last = {k: record[k] for k in _SHOWN if k in record}
    # A preflight (or fleet) fix changes the first launch's line; a log fix ends the current
    # launch.
    cause = snap.cause if trigger in ("preflight", "fleet") else "fix"
    return replace(snap, last_remediation=last, cause=cause), Counts(remediation=labels)


def startup_ok(snap: Snapshot) -> bool:
    """/startupz: SGLang came up (ready once), and nothing stalled or gave up since.

    503 while it starts: a Kubernetes startupProbe stops at its first success, so a 200
    before ready would let the pod past its start-up checks at once, and the 503 of a stall
    or a give-up would never be seen. The probe's failureThreshold x periodSeconds must
    cover the longest start (deploy/kubernetes/).
    """
    return snap.started and snap.gave_up is None and snap.stalled is None


def public(snap: Snapshot, now: float, sglang_version: str | None) -> dict[str, Any]:
    """The /status document (every argv in it was masked when it was journaled)."""
    return {
        "phase": snap.phase,
        "phase_seconds": round(max(0.0, now - snap.since), 3),
        "stage": snap.stage,
        "stalled_stage": snap.stalled,
        "generation": snap.generation,
        "child_up": snap.child_up,
        "ready": snap.ready,
        "gave_up": redact_text(snap.gave_up) if snap.gave_up else None,
        "last_remediation": _masked(snap.last_remediation),
        "backoff_until": snap.backoff_until,
        "sglang_version": sglang_version,
        "argv": list(snap.argv),
        "fleet_fix": _masked(snap.fleet_fix),
    }


def _masked(value: Any) -> Any:
    """Free text masked once more (argvs were masked per option when journaled)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {str(k): _masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v) for v in value]
    return value
