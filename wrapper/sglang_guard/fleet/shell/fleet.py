"""Fleet memory's wiring: look the launch up before the first spawn, learn from the journal.

Before the first launch `Fleet.before_launch` asks the store (`[learn] store`) for this
launch's key on a thread of its own, waiting at most `[learn] timeout_s` (2 s): a store that
does not answer is skipped with a journal line and the guard learns alone. A proven entry is
checked (schema, size, the release's option table, the deny list) and applied as a
preflight fix: `remediated`, trigger `fleet`, with the entry's origin.

While SGLang runs, `FleetObserver` (a loop listener) reads the events the supervision loop
already journals, by their types (no change to the machine): `ready` with a command line
the guard's own fixes made is published as proven; `ready` with a fleet fix adds a
confirmation; a launch with a fleet fix that ends before ready marks the entry known-bad and
goes back to the user's command line.
Every store call after the start runs on one worker thread: the loop never waits for it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import queue
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglang_guard.common.outcomes import (
    ChildExit,
    FleetChange,
    FleetChanged,
    FleetError,
    FleetFix,
    FleetLookup,
    FleetRefused,
    GaveUp,
    JournalEvent,
    LogFix,
    Ready,
    SignalSeen,
)
from sglang_guard.common.record import record
from sglang_guard.common.shell.logsetup import get_logger
from sglang_guard.config.guardconfig import GuardConfig, LearnSection
from sglang_guard.errors import ConfigError
from sglang_guard.fleet import fleet as core
from sglang_guard.fleet.shell.fleetstore import Store, StoreError, open_store
from sglang_guard.rules.rules import RulePack
from sglang_guard.sglang.argv import CommandLine
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.redact import redact_argv, redact_record, redact_text
from sglang_guard.supervise.events import CommandChanged
from sglang_guard.supervise.shell.journal import Journal
from sglang_guard.supervise.shell.observer import Listener, Quiet

if TYPE_CHECKING:
    from sglang_guard.preflight.shell.inputs import Prepared
    from sglang_guard.supervise.actions import Action
    from sglang_guard.supervise.events import Event
    from sglang_guard.supervise.machine import Env, State

Sink = Callable[[JournalEvent], object]


def guard_id(learn: LearnSection, state_dir: str) -> str:
    """How this guard names itself in entries: `[learn] guard_id`, else host and state dir's
    short digest (no path, no user, no secret)."""
    if learn.guard_id:
        return learn.guard_id[:100]
    tag = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:8]
    return f"{socket.gethostname()}:{tag}"


def bounded(call: Callable[[], Any], timeout: float) -> tuple[bool, Any]:
    """(done, result or the exception) of `call` on a daemon thread, waiting at most `timeout`."""
    box: list[Any] = []

    def work() -> None:
        try:
            box.append(call())
        except Exception as exc:  # carried back to the caller as a value
            box.append(exc)

    thread = threading.Thread(target=work, name="fleet-lookup", daemon=True)
    thread.start()
    thread.join(timeout)
    return (True, box[0]) if box else (False, None)


@dataclass
class InUse:
    """The fleet entry the first launch runs with."""

    entry: core.Entry
    cl: CommandLine  # the command line with its edits
    gen: int = 1


class Fleet:
    """One guard's side of the fleet store."""

    def __init__(self, learn: LearnSection, store: Store, *, state_dir: str,
                 key: core.FleetKey, options: OptionTable, derived_dir: str,
                 allow: Sequence[str] = ()) -> None:
        self.learn = learn
        self.store = store
        self.key = key
        self.name = key.digest()
        self.options = options
        self.derived_dir = derived_dir
        self.allow = tuple(allow)
        self.guard = guard_id(learn, state_dir)
        self.state_dir = state_dir
        self.in_use: InUse | None = None
        self.first: CommandLine | None = None  # the launch's command line before any fleet fix
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._sinks: list[Sink] = []
        self.quiet = False

    # -- records --------------------------------------------------------------------------

    def _say(self, event: JournalEvent) -> None:
        for sink in self._sinks:
            with contextlib.suppress(Exception):  # an onlooker's failure is not the fleet's
                sink(event)
        if self.quiet:
            return
        record = event.to_record()
        get_logger().info(record.pop("event"), **record)

    # -- before the first launch ------------------------------------------------------------

    def before_launch(self, cl: CommandLine, sinks: Sequence[Sink]) -> CommandLine:
        """`cl`, or `cl` with this key's proven entry applied (journaled through `sinks`)."""
        self.first = cl
        self._sinks = list(sinks)
        key, store = self.name, self.store.where
        if not self.learn.consume:
            return cl
        done, got = bounded(lambda: self.store.get(self.name), self.learn.timeout_s)
        if not done:
            self._say(FleetLookup(key=key, store=store, result="unavailable",
                                  reason=f"no answer within {self.learn.timeout_s:g}s; "
                                         "learning alone"))
            return cl
        if isinstance(got, BaseException):
            self._say(FleetLookup(key=key, store=store, result="error",
                                  reason=f"{got}; learning alone"))
            return cl
        if got is None:
            self._say(FleetLookup(key=key, store=store, result="miss"))
            return cl
        try:
            entry = core.decode_entry(got, self.name)
        except ValueError as exc:
            self._say(FleetRefused(key=key, store=store, reason=f"malformed entry: {exc}"))
            return cl
        if entry.status != "proven":
            self._say(FleetLookup(key=key, store=store, result="known_bad",
                                  origin=entry.origin.guard, reason="a fix tried and failed "
                                  "for these inputs; learning alone"))
            return cl
        found = core.problems(entry, self.options, self.allow)
        new: CommandLine | None = None
        if not found:
            new, why = core.apply_entry(cl, entry, self.options, self.derived_dir)
            found = [why] if why else []
        if found or new is None:
            self._say(FleetRefused(key=key, store=store, origin=entry.origin.guard,
                                   reason="; ".join(found)))
            return cl
        self._say(FleetLookup(key=key, store=store, result="hit", origin=entry.origin.guard,
                              confirmations=entry.confirmations))
        self._journal_fix(entry, cl, new)
        self.in_use = InUse(entry, new)
        return new

    def _journal_fix(self, entry: core.Entry, before: CommandLine, after: CommandLine) -> None:
        origin = {"guard": entry.origin.guard, "learned_at": entry.origin.learned_at,
                  "confirmations": entry.confirmations}
        for edit in entry.edits:
            self._say(FleetFix(
                key=self.name, flag=edit.flag, action=edit.action, old_value=edit.old_value,
                new_value=edit.new_value,
                reason=f"learned by {entry.origin.guard} at {entry.origin.learned_at} "
                       f"(rules {', '.join(entry.rules) or 'none'}; confirmed "
                       f"{entry.confirmations} times)",
                origin=origin, argv_before=redact_argv(before.argv, self.options),
                argv_after=redact_argv(after.argv, self.options)))

    def reapply(self, prepared: Prepared) -> Prepared:
        """A reload re-prepared the launch: the fleet fix in use stays in it."""
        if self.in_use is None:
            return prepared
        new, _ = core.apply_entry(prepared.cl, self.in_use.entry, self.options, self.derived_dir)
        return replace(prepared, cl=new) if new is not None else prepared

    # -- after the start: one worker thread for every store call -----------------------------

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` on the worker (started on first use)."""
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="fleet", daemon=True)
            self._worker.start()
        self._jobs.put(job)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except StoreError as exc:
                self._say(FleetError(key=self.name, store=self.store.where, error=str(exc)))
            except Exception as exc:  # the fleet never takes the guard down
                self._say(FleetError(key=self.name, error=repr(exc)))

    def close(self, timeout: float) -> None:
        """Let queued store calls finish (bounded: a dead store costs at most `timeout`)."""
        if self._worker is not None:
            self._jobs.put(None)
            self._worker.join(timeout)

    def _now(self) -> str:
        return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")

    def _update(self, decide: Callable[[core.Entry | None], Decision]) -> None:
        """Read, decide, write as one step of the store (another guard may write between
        a read and a write: the store retries with what it then holds)."""
        said: list[Decision] = []

        def change(raw: bytes | None) -> bytes | None:
            old = None
            if raw is not None:
                with contextlib.suppress(ValueError):  # malformed: what we know replaces it
                    old = core.decode_entry(raw, self.name)
            decision = decide(old)
            said[:] = [decision]
            return None if decision.entry is None else decision.entry.encode()

        self.store.update(self.name, change)
        if said and (change_ := said[0].event) is not None:
            d = said[0]
            self._say(FleetChanged(change=change_, key=self.name, store=self.store.where,
                                   status=d.entry.status if d.entry else None, more=d.more))

    def publish(self, ready: CommandLine, rules: Sequence[str], lines: Sequence[str],
                launches: int) -> None:
        """The guard's own fixes reached ready: publish them as proven (worker thread)."""
        first = self.first
        if first is None or not self.learn.publish:
            return
        edits = core.learned_edits(first, ready)
        if not edits:
            return
        entry = core.Entry(self.name, "proven", edits[:core.MAX_EDITS],
                           tuple(dict.fromkeys(rules))[:core.MAX_EDITS],
                           core.fatal_lines(lines), launches,
                           core.Origin(self.guard, self._now(), self.key.sglang,
                                       _gpu(self.key)))

        def decide(old: core.Entry | None) -> Decision:
            if old is not None and old.edits == entry.edits:
                if old.status == "known_bad":
                    return Decision(None, FleetChange.SKIPPED, {
                        "reason": "the same fix is known-bad for these inputs"})
                return Decision(old.confirmed(), FleetChange.CONFIRMED,
                                {"confirmations": old.confirmations + 1})
            return Decision(entry, FleetChange.PUBLISHED, {"edits": len(entry.edits)})

        self.submit(lambda: self._update(decide))

    def gave_up(self, last: CommandLine, rules: Sequence[str], lines: Sequence[str],
                launches: int) -> None:
        """The guard's own fixes never reached ready: publish them as known-bad, unless the
        store holds a proven entry (another guard's fix, which this one did not try)."""
        first = self.first
        if first is None or not self.learn.publish or self.in_use is not None:
            return
        edits = core.learned_edits(first, last)
        if not edits:
            return
        entry = core.Entry(self.name, "known_bad", edits[:core.MAX_EDITS],
                           tuple(dict.fromkeys(rules))[:core.MAX_EDITS],
                           core.fatal_lines(lines), launches,
                           core.Origin(self.guard, self._now(), self.key.sglang,
                                       _gpu(self.key)), failed_by=(self.guard,))

        def decide(old: core.Entry | None) -> Decision:
            if old is not None and old.status == "proven":
                return Decision(None, None)
            return Decision(entry, FleetChange.KNOWN_BAD, {"edits": len(entry.edits)})

        self.submit(lambda: self._update(decide))

    def confirm(self) -> None:
        """The fleet fix reached ready here too: one more confirmation (worker thread)."""
        in_use = self.in_use
        if in_use is None or not self.learn.publish:
            return

        def decide(old: core.Entry | None) -> Decision:
            old = old or in_use.entry
            if old.edits != in_use.entry.edits:
                return Decision(None, None)  # replaced meanwhile: nothing of ours to confirm
            return Decision(old.confirmed(), FleetChange.CONFIRMED,
                            {"confirmations": old.confirmations + 1})

        self.submit(lambda: self._update(decide))

    def mark_known_bad(self) -> None:
        """A launch with the fleet fix failed: nobody tries it again (worker thread)."""
        in_use = self.in_use
        if in_use is None:
            return
        self.in_use = None
        if not self.learn.publish:
            return

        def decide(old: core.Entry | None) -> Decision:
            old = old or in_use.entry
            if old.edits != in_use.entry.edits:
                return Decision(None, None)
            return Decision(old.known_bad(self.guard), FleetChange.KNOWN_BAD, {})

        self.submit(lambda: self._update(decide))


@record
class Decision:
    """What a store update writes (None: nothing) and the record it journals (None: none)."""

    entry: core.Entry | None
    event: FleetChange | None
    more: Mapping[str, Any] = field(default_factory=dict)


def _gpu(key: core.FleetKey) -> str | None:
    parts = [p for p in (key.gpu_name, f"sm{key.gpu_sm}" if key.gpu_sm else None) if p]
    return " ".join(parts) or None


class FleetObserver(Quiet):
    """The loop's observer, teed: the status port sees everything, the fleet reads along."""

    def __init__(self, inner: Listener, fleet: Fleet) -> None:
        self.inner = inner
        self.fleet = fleet
        self._events: queue.Queue[Event] | None = None
        self._cl: CommandLine | None = None
        self._gen = 0
        self._ready = False
        self._signalled = False
        self._log_fixed = False  # a log rule changed the fleet launch's command line
        self._rules: list[str] = []
        self._lines: list[str] = []

    def start(self, events: queue.Queue[Event]) -> None:
        """Keep the queue (a known-bad fix sends the user's command line back through it)."""
        self._events = events
        self.inner.start(events)

    def saw_event(self, event: Event, state: State) -> None:
        """Pass it on."""
        self.inner.saw_event(event, state)

    def stepped(self, state: State, env: Env, actions: Sequence[Action]) -> None:
        """Remember the machine's command line: a `ready` record comes right after."""
        self._cl = state.cl
        self._gen = state.gen
        self.inner.stepped(state, env, actions)

    def saw_action(self, action: Action, state: State) -> None:
        """Pass it on."""
        self.inner.saw_action(action, state)

    def record(self, event: JournalEvent) -> None:
        """Pass it on; act on ready, remediations, signals and exits."""
        self.inner.record(event)
        with contextlib.suppress(Exception):  # the fleet never breaks the loop
            self._read(event)

    def close(self) -> None:
        """Pass it on."""
        self.inner.close()

    def _read(self, event: JournalEvent) -> None:
        fleet = self.fleet
        if isinstance(event, LogFix):
            self._rules.append(event.rule)
            self._lines.append(event.line)
            if fleet.in_use is not None and event.gen == fleet.in_use.gen:
                self._log_fixed = True
        elif isinstance(event, SignalSeen):
            self._signalled = True
        elif isinstance(event, GaveUp) and not self._ready and self._cl is not None:
            fleet.gave_up(self._cl, self._rules, self._lines, self._gen)
        elif isinstance(event, Ready) and not self._ready and self._cl is not None:
            self._ready = True
            if fleet.in_use is not None and self._cl.argv == fleet.in_use.cl.argv:
                fleet.confirm()
            elif fleet.in_use is None:
                fleet.publish(self._cl, self._rules, self._lines, max(0, self._gen - 1))
        elif isinstance(event, ChildExit) and not self._ready and not self._signalled \
                and fleet.in_use is not None and event.gen == fleet.in_use.gen:
            fleet.mark_known_bad()
            first = fleet.first
            if not self._log_fixed and first is not None and self._events is not None:
                # As it would have alone: the user's command line, from the next launch on.
                self._events.put(CommandChanged(first, "fleet fix failed"))


def open_fleet(cfg: GuardConfig, state_dir: str, prepared: Prepared,
               packs: Sequence[RulePack]) -> Fleet | None:
    """The fleet for this launch (None: `[learn]` has no store)."""
    learn = cfg.learn
    if not learn.enabled:
        return None
    from sglang_guard.group.shell.group import model_config_hash  # noqa: PLC0415

    cl = prepared.cl
    key = core.make_key(
        cl, sglang=prepared.release.version or prepared.options.sglang_version,
        model_config=model_config_hash(cl.value("model_path"), cl.value("revision")),
        draft_config=model_config_hash(cl.value("speculative_draft_model_path"),
                                       cl.value("speculative_draft_model_revision")),
        gpu_name=prepared.gpu.name, gpu_sm=prepared.gpu.sm, packs=packs)
    from sglang_guard.preflight.shell.inputs import derived_dir  # noqa: PLC0415

    return Fleet(learn, open_store(learn), state_dir=state_dir, key=key,
                 options=prepared.options, derived_dir=derived_dir(state_dir),
                 allow=cfg.rules.allow_set)


def own_journal(state_dir: str) -> Journal | None:
    """A journal handle of the fleet's own (its worker may outlive the loop's handle)."""
    try:
        return Journal.open(state_dir)
    except ConfigError:  # reported once by the runner already
        return None


def check_view(cfg: GuardConfig, state_dir: str, prepared: Prepared) -> dict[str, Any] | None:
    """What `check` shows of fleet memory: the lookup, and the command line a fleet fix makes."""
    if not cfg.learn.enabled or not cfg.learn.consume:
        return None
    from sglang_guard.rules.shell.packs import load_packs  # noqa: PLC0415

    fleet = open_fleet(cfg, state_dir, prepared, load_packs(cfg, prepared.options))
    if fleet is None:
        return None
    said: list[JournalEvent] = []
    fleet.quiet = True  # `check` prints its own lines, no log records
    after = fleet.before_launch(prepared.cl, [said.append])
    lines = []
    for event in said:
        if isinstance(event, FleetLookup | FleetRefused):
            result = event.result if isinstance(event, FleetLookup) else ""
            lines.append(f"fleet: {event.event.removeprefix('fleet.')} {result} "
                         f"{event.reason or ''}".replace("  ", " ").strip())
    if fleet.in_use is not None:
        e = fleet.in_use.entry
        edits = "; ".join(f"{x.action} {x.flag} {x.new_value or x.old_value or ''}".strip()
                          for x in e.edits)
        lines.append(f"fleet: applies {edits} (learned by {e.origin.guard} at "
                     f"{e.origin.learned_at}, confirmed {e.confirmations} times)")
    return {"key": fleet.name, "store": redact_text(fleet.store.where),
            "applied": fleet.in_use is not None,
            "argv_after": redact_argv(after.argv, prepared.options) if fleet.in_use else None,
            "records": [redact_record(event.to_record()) for event in said],
            "lines": [redact_text(line) for line in lines]}
