"""The outcome vocabulary: the machine's phases, the kinds of fix, the causes of a give-up.

String enums (`StrEnum`): a member equals its value, so the journal and the labels keep the
same spelling, and what still compares strings keeps working while the consumers move over.
And the journal's events, one frozen value per record kind (`JournalEvent.to_record()` is
where a record's keys are spelled); consumers match on their types, never on record dicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field, fields
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar

from sglang_guard.common.record import record


class Phase(StrEnum):
    """The supervision machine's phase (`supervise/machine.State.phase`)."""

    IDLE = "idle"  # nothing launched yet (preflight, the orphan clean-up)
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    PICKING = "picking"  # the old tree is gone; the shell looks for a free port
    HELD = "held"  # a worker whose SGLang exited waits for its group's leader
    DONE = "done"


class FixKind(StrEnum):
    """What a rule does when it fires (a rule pack's `action`)."""

    DROP_FLAG = "drop_flag"
    SET_FLAG = "set_flag"
    REWRITE_VALUE = "rewrite_value"
    RESTART = "restart"
    GIVE_UP = "give_up"
    UNDO_GUARD_EDIT = "undo_guard_edit"
    ENVIRONMENT = "environment"
    ADVICE = "advice"
    PARSER_EXIT = "parser_exit"  # SGLang's parser rejected the command line: exit 2


class StopCause(StrEnum):
    """Why the machine stopped a tree it did not lose to a crash: the status board's restart
    cause (/status `cause`, the next launch's restart reason). Set where the stop is decided."""

    LIVENESS = "liveness"  # failed liveness probes in a row
    READY_TIMEOUT = "ready_timeout"  # not ready within [restart] ready_timeout_s
    RELOAD = "reload"  # a changed config file asks for a relaunch


class GiveUpCause(StrEnum):
    """Why the guard gave up: the give-up record's `cause`, the metrics' `reason` label."""

    CRASH_LOOP = "crash_loop"  # max_failures within window_s
    FIX_NOT_HELD = "fix_not_held"  # a rule fired again after its fix, nothing to restore
    RULE = "rule"  # a give_up, environment or parser_exit rule, or a fix SGLang would reject
    PORT_BUSY = "port_busy"  # SGLang's port is held by another process
    STALLED = "stalled"  # a start-up stage made no progress ([start] on_stall = "give_up")
    REFUSED = "refused"  # the policy refused the command line (a worker: its leader's launch)
    REPEATED_CRASH = "repeated_crash"  # the same crash twice with the same command line
    LEADER_LOST = "leader_lost"  # a group worker lost (or never reached) its leader
    OTHER = "other"

    @classmethod
    def of(cls, value: object) -> GiveUpCause:
        """The cause a record names; OTHER for none or one not known."""
        try:
            return cls(str(value))
        except ValueError:
            return cls.OTHER


# -- the journal's events: one frozen value per record kind --------------------------------
#
# The machine and the shell emit these; the journal writer, the status board, the group
# links and the fleet match on their types. `to_record()` is the one place a record's keys
# are spelled: the journal keeps the format it had when records were dicts
# (tests/unit/test_journal_events.py compares every kind with a recorded run's journal).


@record(kw_only=True)
class JournalEvent:
    """One journal record. Subclasses name their `EVENT`; their fields are its keys."""

    EVENT: ClassVar[str] = ""
    # Fields left out of the record when None (today's records carry them only sometimes).
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()
    KEYS: ClassVar[Mapping[str, str]] = MappingProxyType({})  # field -> key, where they differ

    @property
    def event(self) -> str:
        """The record's `event` key."""
        return self.EVENT

    def to_record(self) -> dict[str, Any]:
        """The journal record: `event` first, then the fields in their order."""
        record: dict[str, Any] = {"event": self.event}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in self.OPTIONAL:
                continue
            record[self.KEYS.get(f.name, f.name)] = value
        return record


_NODE = frozenset({"node"})  # a leader journals a worker's line with the worker's rank


# -- a launch and its end --


@record(kw_only=True)
class ChildStarted(JournalEvent):
    """Launch `gen` of SGLang began (argv masked)."""

    EVENT: ClassVar[str] = "child.start"
    gen: int
    reason: str
    argv: Sequence[str]


@record(kw_only=True)
class ChildExit(JournalEvent):
    """SGLang's main process of launch `gen` exited."""

    EVENT: ClassVar[str] = "child.exit"
    gen: int
    pid: int
    returncode: int


@record(kw_only=True)
class NotStarted(JournalEvent):
    """A launch was called off while it waited for SGLang's port."""

    EVENT: ClassVar[str] = "child.not_started"
    gen: int
    reason: str


@record(kw_only=True)
class Ready(JournalEvent):
    """Launch `gen` answered its health check."""

    EVENT: ClassVar[str] = "ready"
    gen: int
    argv: Sequence[str]


@record(kw_only=True)
class Stable(JournalEvent):
    """Launch `gen` stayed ready for `stable_after_s`: the past is forgiven."""

    EVENT: ClassVar[str] = "stable"
    gen: int


@record(kw_only=True)
class LivenessFailed(JournalEvent):
    """A /health_generate probe failed (`streak` in a row)."""

    EVENT: ClassVar[str] = "liveness.failed"
    gen: int
    streak: int
    detail: str


@record(kw_only=True)
class StageStarted(JournalEvent):
    """SGLang entered a start-up stage."""

    EVENT: ClassVar[str] = "start.stage"
    gen: int
    stage: str


@record(kw_only=True)
class StartStalled(JournalEvent):
    """A start-up stage made no progress within its limit."""

    EVENT: ClassVar[str] = "start.stalled"
    gen: int
    stage: str
    line: str
    silent_s: float
    limit_s: float
    action: str  # [start] on_stall


@record(kw_only=True)
class BackingOff(JournalEvent):
    """A failed launch: the next one waits `delay_s`."""

    EVENT: ClassVar[str] = "backoff"
    delay_s: float
    reason: str
    failures_in_window: int


@record(kw_only=True)
class SignalSeen(JournalEvent):
    """The guard was told to stop (SIGTERM, SIGINT)."""

    EVENT: ClassVar[str] = "guard.signal"
    signal: str


@record(kw_only=True)
class GuardExit(JournalEvent):
    """The guard ended with this status."""

    EVENT: ClassVar[str] = "guard.exit"
    code: int
    reason: str


@record(kw_only=True)
class RestartPlanned(JournalEvent):
    """A config edit changed SGLang's command line: one graceful restart."""

    EVENT: ClassVar[str] = "restart.planned"
    reason: str
    argv_after: Sequence[str]


# -- what a log line (or preflight, or fleet memory) changed --


@record(kw_only=True)
class LogFix(JournalEvent):
    """A rule's fix edited the command line (a `free_port` fix names the busy port)."""

    EVENT: ClassVar[str] = "remediated"
    OPTIONAL: ClassVar[frozenset[str]] = _NODE
    trigger: str = "log"
    rule: str
    line: str
    gen: int
    flag: str | None
    action: str
    old_value: str | None
    new_value: str | None
    reason: str
    free_port: bool = False
    busy_port: int | None = None
    argv_before: Sequence[str]
    argv_after: Sequence[str]
    node: int | None = None

    def to_record(self) -> dict[str, Any]:
        """As any record; `free_port` and `busy_port` only for a free-port fix."""
        record = JournalEvent.to_record(self)
        if not self.free_port:
            del record["free_port"], record["busy_port"]
        return record


@record(kw_only=True)
class UndoFix(JournalEvent):
    """SGLang's parser rejected the guard's own change: the command line before it returns."""

    EVENT: ClassVar[str] = "remediated"
    OPTIONAL: ClassVar[frozenset[str]] = _NODE
    trigger: str = "log"
    rule: str
    line: str
    gen: int
    flag: str
    action: str = "undo"
    reason: str
    argv_before: Sequence[str]
    argv_after: Sequence[str]
    node: int | None = None


@record(kw_only=True)
class PreflightFinding(JournalEvent):
    """A preflight finding: `remediated` when it changed the line, else `preflight.<action>`."""

    trigger: str = "preflight"
    rule: str
    flag: str
    value: str | None
    action: str
    new_value: str | None
    reason: str
    argv_before: Sequence[str]
    argv_after: Sequence[str]

    @property
    def is_fix(self) -> bool:
        """Whether the finding changed the command line (a drop or a rewrite)."""
        return self.action in ("drop", "rewrite")

    @property
    def event(self) -> str:
        """`remediated`, or `preflight.<action>`."""
        return "remediated" if self.is_fix else f"preflight.{self.action}"


@record(kw_only=True)
class FleetFix(JournalEvent):
    """An edit of a proven fleet entry, applied before the first launch."""

    EVENT: ClassVar[str] = "remediated"
    trigger: str = "fleet"
    rule: str = "fleet"
    key: str
    flag: str
    action: str
    old_value: str | None
    new_value: str | None
    reason: str
    origin: Mapping[str, Any]
    argv_before: Sequence[str]
    argv_after: Sequence[str]


@record(kw_only=True)
class Restored(JournalEvent):
    """A rule fired again after its fix: the last command line that reached ready returns."""

    EVENT: ClassVar[str] = "restored"
    OPTIONAL: ClassVar[frozenset[str]] = _NODE
    rule: str
    line: str
    gen: int
    argv_after: Sequence[str]
    reason: str
    node: int | None = None


@record(kw_only=True)
class FixRefused(JournalEvent):
    """A fix would give a command line SGLang's parser rejects: not applied."""

    EVENT: ClassVar[str] = "fix.refused"
    OPTIONAL: ClassVar[frozenset[str]] = _NODE
    rule: str
    flag: str | None
    new_value: str | None
    gen: int
    reason: str
    node: int | None = None


@record(kw_only=True)
class CrashDetected(JournalEvent):
    """A `restart` rule matched: SGLang crashed in a way known to pass."""

    EVENT: ClassVar[str] = "crash.detected"
    OPTIONAL: ClassVar[frozenset[str]] = _NODE
    trigger: str = "log"
    rule: str
    line: str
    gen: int
    reason: str
    node: int | None = None


@record(kw_only=True)
class Advice(JournalEvent):
    """An advice rule matched: what to read; nothing changed."""

    EVENT: ClassVar[str] = "advice"
    OPTIONAL: ClassVar[frozenset[str]] = _NODE
    trigger: str = "log"
    rule: str
    record: str | None
    line: str
    gen: int
    reason: str
    explanation: str
    solutions: Sequence[str]
    prevention: Sequence[str]
    source: str | None
    node: int | None = None


# -- giving up --


@record(kw_only=True)
class GiveUpPlanned(JournalEvent):
    """The guard will give up once SGLang's tree is stopped (`klass`: the record's `class`)."""

    EVENT: ClassVar[str] = "give_up.planned"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"trigger", "rule", "line", "klass", "node"})
    KEYS: ClassVar[Mapping[str, str]] = MappingProxyType({"klass": "class"})
    trigger: str | None = None
    rule: str | None = None
    line: str | None = None
    gen: int
    klass: str | None = None  # environment | usage
    reason: str
    node: int | None = None


@record(kw_only=True)
class GaveUp(JournalEvent):
    """The guard gave up, for this cause (the metrics' label; never read from `reason`)."""

    EVENT: ClassVar[str] = "give_up"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"line"})
    reason: str
    line: str | None = None  # the same crash twice: its exception line
    cause: GiveUpCause


# -- a multi-node group --


@record(kw_only=True)
class GroupStarted(JournalEvent):
    """This node is part of a group."""

    EVENT: ClassVar[str] = "group.start"
    rank: int
    nnodes: int
    leader: str
    port: int


@record(kw_only=True)
class NodeDown(JournalEvent):
    """Leader: a worker's SGLang exited, stalled or went silent; the group restarts."""

    EVENT: ClassVar[str] = "group.node_down"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"stage"})
    gen: int
    node: int
    reason: str
    stage: str | None = None


@record(kw_only=True)
class GroupRelaunched(JournalEvent):
    """Worker: the leader started group generation `group_gen` (`cause`: its decision)."""

    EVENT: ClassVar[str] = "group.relaunch"
    group_gen: int
    cause: Mapping[str, Any]
    argv_after: Sequence[str]


@record(kw_only=True)
class GroupExited(JournalEvent):
    """Worker: the group ends, as the leader (or its loss) says."""

    EVENT: ClassVar[str] = "group.exit"
    code: int
    reason: str


@record(kw_only=True)
class GroupRejected(JournalEvent):
    """Leader: a request refused (`suppressed`: the like ones not journaled since)."""

    EVENT: ClassVar[str] = "group.rejected"
    peer: str
    path: str
    status: int
    reason: str
    suppressed: int


@record(kw_only=True)
class LearnedRefused(JournalEvent):
    """Leader: the learned command line is not replayed."""

    EVENT: ClassVar[str] = "learned.refused"
    path: str
    reason: str


@record(kw_only=True)
class LearnedReplayed(JournalEvent):
    """Leader: the learned command line is launched instead of the user's."""

    EVENT: ClassVar[str] = "learned.replayed"
    path: str
    argv_before: Sequence[str]
    argv_after: Sequence[str]


# -- the guard's own housekeeping --


@record(kw_only=True)
class ReloadApplied(JournalEvent):
    """A reload was taken (`restart`: SGLang restarts with the new command line)."""

    EVENT: ClassVar[str] = "reload.applied"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"changed", "note"})
    kind: str
    path: str | None
    restart: bool
    changed: Sequence[str] | None = None
    why: str
    note: str | None = None  # a group worker does not restart on its own


@record(kw_only=True)
class ReloadRejected(JournalEvent):
    """A reload was refused: what keeps serving."""

    EVENT: ClassVar[str] = "reload.rejected"
    kind: str
    path: str | None
    error: str
    keeps: str


@record(kw_only=True)
class OrphansStopped(JournalEvent):
    """What a SIGKILLed guard left behind, verified and stopped."""

    EVENT: ClassVar[str] = "orphans.stopped"
    pgid: int
    guard_pid: object
    pids: Sequence[int]
    terminated: int
    killed: int


@record(kw_only=True)
class OrphansLeft(JournalEvent):
    """What was left alone (`pgid` None: the child record itself could not be read)."""

    EVENT: ClassVar[str] = "orphans.left"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"pids"})
    pgid: int | None = None
    guard_pid: object = None
    pids: Sequence[int] | None = None
    reason: str

    def to_record(self) -> dict[str, Any]:
        """As any record; no `pgid`/`guard_pid` when the record was unreadable."""
        record = JournalEvent.to_record(self)
        if self.pgid is None:
            del record["pgid"], record["guard_pid"]
        return record


@record(kw_only=True)
class StatusListening(JournalEvent):
    """Where the status port listens."""

    EVENT: ClassVar[str] = "status.listening"
    host: str
    port: int


# -- fleet memory (fleet/shell/fleet.py) --


@record(kw_only=True)
class FleetLookup(JournalEvent):
    """The store was asked for this key's entry (`result`: hit, miss, known_bad, error,
    unavailable)."""

    EVENT: ClassVar[str] = "fleet.lookup"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"origin", "confirmations", "reason"})
    key: str
    store: str
    result: str
    origin: str | None = None
    confirmations: int | None = None
    reason: str | None = None


@record(kw_only=True)
class FleetRefused(JournalEvent):
    """The key's entry is not applied."""

    EVENT: ClassVar[str] = "fleet.refused"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"origin"})
    key: str
    store: str
    origin: str | None = None
    reason: str


@record(kw_only=True)
class FleetError(JournalEvent):
    """A store call failed (the guard goes on alone)."""

    EVENT: ClassVar[str] = "fleet.error"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"store"})
    key: str
    store: str | None = None
    error: str


class FleetChange(StrEnum):
    """What a store write did to the key's entry (the record's `event`)."""

    PUBLISHED = "fleet.published"
    CONFIRMED = "fleet.confirmed"
    KNOWN_BAD = "fleet.known_bad"
    SKIPPED = "fleet.skipped"  # the same fix is known-bad already: nothing written


@record(kw_only=True)
class FleetChanged(JournalEvent):
    """The store's entry for the key was written (`more`: what the change adds)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"status"})
    change: FleetChange
    key: str
    store: str
    status: str | None = None
    more: Mapping[str, Any] = field(default_factory=dict)

    @property
    def event(self) -> str:
        """The change's name."""
        return self.change.value

    def to_record(self) -> dict[str, Any]:
        """`event`, key, store, status and what the change adds, flat."""
        record = JournalEvent.to_record(self)
        del record["change"], record["more"]
        return {**record, **self.more}


# A leader journals a worker's line as its own, with the worker's rank (`node`).
NODE_TAGGED = (LogFix, UndoFix, Restored, FixRefused, CrashDetected, Advice, GiveUpPlanned)
# A remediation, whoever made it (the status board's last_remediation, its counts).
REMEDIATIONS = (LogFix, UndoFix, PreflightFinding, FleetFix, Restored)
