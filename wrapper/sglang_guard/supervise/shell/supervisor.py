"""The supervision loop: one consumer of one event queue, carrying out the machine's actions.

Producers (child readers, health probes, timers, signal handlers, file watchers) only put
events; this loop alone decides (via the pure `supervise.machine.step`) and acts. Nothing blocks
it: every wait or slow step is a job (supervise/shell/jobs.py) whose result comes back as an event,
so a signal, a /livez tick and the watchdog's period are answered at once in every phase.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import psutil

from sglang_guard.common.outcomes import (
    GaveUp,
    GiveUpCause,
    GuardExit,
    JournalEvent,
    NotStarted,
    StageStarted,
)
from sglang_guard.common.shell import stderrgate
from sglang_guard.common.shell.files import write_private
from sglang_guard.common.shell.logsetup import get_logger
from sglang_guard.errors import ConfigError, GiveUp, GuardError
from sglang_guard.rules.linereader import Find, Hits, Line, LineReader, LiteralScan
from sglang_guard.rules.logline import LINE_CAP, clean
from sglang_guard.rules.quick import Quick
from sglang_guard.rules.stages import READY_LINE
from sglang_guard.sglang.argv import CommandLine
from sglang_guard.sglang.redact import redact_text
from sglang_guard.supervise import machine
from sglang_guard.supervise.actions import (
    Action,
    Exit,
    Journal,
    Notify,
    PickPort,
    Probe,
    Reload,
    Schedule,
    Spawn,
    Stop,
)
from sglang_guard.supervise.events import (
    ChildExited,
    ChildLine,
    ChildOutput,
    ChildStage,
    CommandChanged,
    Event,
    HealthResult,
    JobDone,
    PortChosen,
    SignalReceived,
    Stream,
    Tick,
)
from sglang_guard.supervise.shell import health, orphans, ports, proctree, stopsignals
from sglang_guard.supervise.shell.child import END_WAIT_S, Child
from sglang_guard.supervise.shell.eventqueue import EventQueue
from sglang_guard.supervise.shell.jobs import Jobs
from sglang_guard.supervise.shell.journal import Journal as JournalFile
from sglang_guard.supervise.shell.notify import Notifier
from sglang_guard.supervise.shell.observer import NO_OBSERVER, Listener, Quiet
from sglang_guard.supervise.shell.proctree import Stopping
from sglang_guard.supervise.shell.timers import Timers
from sglang_guard.supervise.shell.watch import FileWatcher, Kind

if TYPE_CHECKING:
    from sglang_guard.rules.rules import Matcher
    from sglang_guard.supervise.shell.reloader import ReloadOutcome

PORT_WAIT_S = 60.0  # after a stop, how long the old server may hold the port
# systemd's notify variables are the guard's: SGLang must not send READY=1 or ping the
# watchdog in the guard's name (NotifyAccess=main ignores it, =all would believe it).
GUARD_ONLY_ENV = frozenset({"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"})
SIGNAL_POLL_S = 0.2  # the longest the loop waits for an event (see Supervisor._next_event)
_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass
class Runtime:
    """What the loop needs besides the machine: the launch prefix and the I/O endpoints."""

    launch: Sequence[str]  # e.g. [python, "-m", "sglang.launch_server"]
    state_dir: str
    env: machine.Env
    # (kind, path, the Env in force) -> what changes; `reloader.Reloader.reload`
    reload: Callable[[str, str | None, machine.Env], ReloadOutcome]
    watch: Mapping[str, Kind] = field(default_factory=dict)  # files to watch, and what they are
    stdout: BinaryIO = sys.stdout.buffer
    stderr: BinaryIO = field(default_factory=stderrgate.child_stderr)  # shared with our events
    child_env: dict[str, str] | None = None
    # a multi-node group's leader or worker side (group/shell/group.py)
    group: Listener | None = None
    observer: Listener = NO_OBSERVER  # the status port's hooks (status/shell/status.py)


class Supervisor:
    """Runs SGLang under the state machine until it says Exit."""

    def __init__(self, rt: Runtime, cl: CommandLine, journal: JournalFile | None) -> None:
        self.rt = rt
        # The loop marks each event done once stepped and acted on: a reader may then stop
        # the child early on lines the loop will stop it for (supervise/shell/eventqueue.py).
        self.events = EventQueue()
        self.state = machine.State(cl=cl)
        self.child: Child | None = None
        self.journal = journal
        self.notifier = Notifier()
        self.log = get_logger()
        self._timers = Timers()  # served by the loop itself (`_next_event`)
        self._stoppers: list[threading.Thread] = []
        # Signal handlers put here: SimpleQueue.put is reentrant, Queue.put is not (a handler
        # runs between two bytecodes of the loop thread, perhaps while it holds the Queue's
        # lock); a small thread forwards each signal to the event queue.
        self._signals: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._pidfile = Path(rt.state_dir) / "child.pgid"
        # marks this guard's children (see supervise/shell/orphans.py)
        self._token = orphans.new_token()
        self._jobs = Jobs(self.events)
        self._launching: tuple[int, int] | None = None  # (gen, job) of a launch waiting its turn
        # A Stop whose SIGTERM went out before its step's other actions (`_terminate_first`),
        # for `_stop` to finish: (the action, its child, the stop begun).
        self._terminated: tuple[Stop, Child, Stopping] | None = None
        self._reloads: list[Reload] = []  # one reload runs at a time; the rest wait here
        self._watchdog_s = _watchdog_period(self.notifier)
        self._next_ping = 0.0
        self._begun = False  # the first launch was asked for (the orphans are gone)
        self._early: list[Event] = []  # what came before it, for after it
        # The newest chunk tail (and whether any chunk redrew a bar) per (gen, stream) that
        # the loop has not taken yet; the streams whose ChildOutput is on the queue; when
        # each stream's last one was put (`_chunk_watcher`).
        self._outputs: dict[tuple[int, Stream], tuple[bytes, bool]] = {}
        self._outputs_queued: set[tuple[int, Stream]] = set()
        self._outputs_put: dict[tuple[int, Stream], float] = {}
        self._outputs_lock = threading.Lock()
        # Who hears the loop: the group link first (a leader's workers hear how it ended
        # before anything else closes), the status board, then the journal writer.
        self._listeners: list[Listener] = [
            *([rt.group] if rt.group is not None else []), rt.observer, _Recorder(self)]

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> int:
        """Supervise until done; the exit status."""
        forwarder = threading.Thread(target=self._forward_signals, name="signals", daemon=True)
        forwarder.start()
        old = {s: signal.signal(s, self._on_signal) for s in _HANDLED}
        stopsignals.disarm()  # the loop's handlers only enqueue; the early ones raised
        watcher = FileWatcher(self.events, self.rt.watch) if self.rt.watch else None
        if watcher is not None:
            watcher.start()
        for listener in self._listeners:
            listener.start(self.events)
        try:
            # What a SIGKILLed guard left behind goes first; the first launch waits for it
            # (the machine stays idle meanwhile: a signal then ends the run at once).
            grace = self.rt.env.restart.stop_grace_s
            self._jobs.start("orphans", lambda _cancel: orphans.reap(self._pidfile, grace),
                             self._begin)
            code = None
            while code is None:
                event = self._next_event()
                if event is None:
                    continue
                try:
                    code = self._handle(event)
                finally:
                    self.events.task_done()  # stepped and acted on (EventQueue.put_lines)
            return code
        finally:
            for listener in self._listeners:  # first: a leader's workers hear how it ended
                listener.close()
            self._jobs.close()
            if watcher is not None:
                watcher.stop()
            self._timers.close()
            for s, handler in old.items():
                signal.signal(s, handler)
            self._signals.put(None)
            forwarder.join()
            grace = self.rt.env.restart.stop_grace_s
            for stopper in self._stoppers:  # bounded: a blocked stdout must not hold the exit
                stopper.join(grace)
            begun, self._terminated = self._terminated, None
            if self.child is not None:  # also what outlived the main process: leave nothing
                self.child.stop(grace, timeout=max(grace, 1.0),
                                begun=begun[2] if begun and begun[1] is self.child else None)
            with contextlib.suppress(OSError):  # an unusable state dir was reported already
                self._pidfile.unlink(missing_ok=True)
            self.notifier.close()

    def _handle(self, event: Event) -> int | None:
        """One event taken off the queue: step the machine, act; the exit status, if any."""
        if isinstance(event, JobDone):
            return self._guarded(functools.partial(self._jobs.finish, event))
        if not self._begun and not isinstance(event, SignalReceived | Tick):
            self._early.append(event)  # a file change, a group order: after the start
            return None
        if isinstance(event, ChildOutput):
            event = self._output(event)
        elif isinstance(event, ChildLine) and self.child is not None \
                and self.child.gen == event.gen:
            self.child.wait_early_end(END_WAIT_S)  # the child's end first (once)
        for listener in self._listeners:
            listener.saw_event(event, self.state)
        self.state, actions = machine.step(
            self.state, event, self.rt.env, time.monotonic(), random.random()  # noqa: S311
        )
        self._terminate_first(actions)  # before the listeners: SIGTERM is the race
        self._stepped(actions)
        return self._act(actions)

    def _warm_pump(self) -> None:
        """Each pipe thread's first act (Child.spawn's `warm`): its Hyperscan scratch
        (Matcher.warm_thread), then a fatal line's whole way on this thread, on throwaway
        state: read as a pump reads a chunk (`rehearse_reading`), then decided, the early
        stop's question included (machine.rehearse). On a quiet stream the first fatal line
        is read, decided and stopped on by its reader thread, and what that way touches
        first on a thread (its stacks, its malloc arena: ~200 page faults on the idle
        reaction, each slow on a VM that hands free pages back to its host) was otherwise
        paid then (bench/README.md, "The log path, ninth round, and reaction, eighth
        round"). A failure here is no pump's: the thread reads on, unwarmed."""
        env = self.rt.env
        env.matcher.warm_thread()
        try:
            rehearse_reading(env.matcher)
            machine.rehearse(env, self.state.cl)
        except Exception:  # a warm-up never stops a pump
            return

    def _stops_at(self, lines: Sequence[ChildLine]) -> bool:
        """A reader asks, with the loop caught up: do these lines stop the child?"""
        return machine.stops_at(self.state, self.rt.env, lines)

    def _begin(self, reaped: list[JournalEvent]) -> int | None:
        """The orphans are gone: the first launch."""
        for record in reaped:
            self._record(record)
        if self.state.phase != "idle":  # a signal ended the run meanwhile
            return None
        self._begun = True
        for event in self._early:
            self.events.put(event)
        self.state, actions = machine.start(self.state, self.rt.env)
        self._stepped(actions)
        return self._act(actions)

    def _stepped(self, actions: list[Action]) -> None:
        for listener in self._listeners:
            listener.stepped(self.state, self.rt.env, actions)

    def _next_event(self) -> Event | None:
        """The next event; None when SIGNAL_POLL_S (or the watchdog's period) passed first.
        A timer that fell due goes on the queue first (supervise/shell/timers.py: the loop
        serves its timers; the wait ends at the next one's due time).

        The wait is never unbounded: a signal that the kernel hands to another thread only
        flags the interpreter, and the Python handler runs on this (the main) thread once it
        runs again; blocked on an empty queue it would not, until some event came (measured:
        a SIGTERM during a quiet reload waited for the reload's end).

        Under a systemd watchdog the loop itself pings, between two events, while SGLang
        loads or restarts (systemd counts from the start, and loading takes minutes): a
        wedged loop stops the pings. Once SGLang is ready, the pings come only from passing
        /health_generate probes (the machine's Notify), so a hung server is what systemd sees.
        """
        now = time.monotonic()
        for tick in self._timers.due(now):  # behind every event that came before it
            self.events.put(tick)
        wait = SIGNAL_POLL_S
        due = self._held_outputs(now)
        if due is not None:
            wait = min(wait, max(0.0, due - now))
        due = self._timers.next_due()
        if due is not None:
            wait = min(wait, max(0.0, due - now))
        if self._watchdog_s is not None:
            if now >= self._next_ping:
                if self.state.phase != "ready" or not self.rt.env.health.enabled:
                    self.notifier.send("WATCHDOG=1")
                self._next_ping = now + self._watchdog_s
            wait = min(wait, max(0.0, self._next_ping - now))
        try:
            return self.events.get(timeout=wait)
        except queue.Empty:
            return None

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals.put(signum)  # only enqueue: the loop acts

    def _forward_signals(self) -> None:
        while (signum := self._signals.get()) is not None:
            self.events.put(SignalReceived(signum))

    def _act(self, actions: list[Action]) -> int | None:
        if self._terminated is None:  # the loop sends it before the listeners hear the step
            self._terminate_first(actions)
        for action in actions:
            for listener in self._listeners:
                listener.saw_action(action, self.state)
            if isinstance(action, Exit):
                self.notifier.send("STOPPING=1", f"STATUS=exiting {action.code}: "
                                   f"{redact_text(action.reason)[:200]}")
                self._record(GuardExit(code=action.code, reason=action.reason))
                if action.code:
                    self.log.error("guard.exit", code=action.code, reason=action.reason)
                return action.code
            self._guarded(functools.partial(self._do, action))
        return None

    def _terminate_first(self, actions: list[Action]) -> None:
        """A step that stops the running child sends its SIGTERM before anything else it does.

        The actions before the Stop (the decision's journal records, fsync'd, that every
        listener hears; the systemd status) then run while the child's tree goes down, in
        their order, and `_stop` finishes the stop (the grace, SIGKILL) on its thread. Only
        when those actions are journal records, notifications and timers: none of them
        changes the child or a launch waiting for its port, which the Stop reads.
        """
        for action in actions:
            if isinstance(action, Stop):
                break
            if not isinstance(action, Journal | Notify | Schedule):
                return
        else:
            return
        child = self.child
        if (child is None or child.gen != action.gen
                or (self._launching is not None and self._launching[0] == action.gen)):
            return  # `_stop` handles it (nothing running, or a launch still waiting)
        try:
            self._terminated = (action, child, child.terminate())
        except (OSError, psutil.Error) as exc:  # `_stop`'s own stop tries again
            self.log.warning("child.terminate_failed", gen=action.gen, error=str(exc))

    def _guarded(self, work: Callable[[], int | None]) -> int | None:
        """Run one action or one job's hand-over; a give-up it raises is journaled first."""
        try:
            return work()
        except GiveUp as exc:
            self._record(GaveUp(reason=str(exc), cause=GiveUpCause.of(exc.cause)))
            raise

    def _do(self, action: Action) -> None:
        if isinstance(action, Spawn):
            self._spawn(action)
        elif isinstance(action, Stop):
            self._stop(action)
        elif isinstance(action, Probe):
            self._probe(action)
        elif isinstance(action, Schedule):
            self._timers.schedule(action.delay, Tick(action.name, action.gen))
        elif isinstance(action, Journal):
            self._record(action.record)
            if isinstance(action.record, StageStarted):  # STATUS= names the stage
                self.notifier.send(f"STATUS=loading: {action.record.stage} "
                                   f"(launch {action.record.gen})")
        elif isinstance(action, Notify):
            self._notify(action)
        elif isinstance(action, Reload):
            self._reload(action)
        elif isinstance(action, PickPort):
            self._pick_port(action)

    # -- actions ---------------------------------------------------------------------------

    def _scan(self) -> Find:
        """Reader threads ask this per chunk: which of its lines might matter to the machine
        (rules/rules.Matcher.line_scan, the current phase's patterns: a superset)?

        The same scan finds the start-up stage markers, so a marker line costs no per-line
        work: the line reader hands each on (`_stage_sink`) in stream order.
        """

        def find(block: bytes) -> Hits:
            # Past the start only running-phase rules act (supervise/machine.py reads lines only
            # while starting or ready); a chunk read just before the switch gets the full
            # scan, a superset. A stale read is harmless either way.
            return self.rt.env.matcher.line_scan(block, self.state.phase == "starting")

        return find

    def _scan_on_reader(self) -> LiteralScan | bool:
        """The pumps' readers ask this per chunk: may the reader scan it (the current phase's
        scan takes no GIL per hit), or does the thread that reads its lines? Past the start,
        the running set of literals the reader searches in its read's own call (the same
        object while the matcher holds: a reload or a phase switch during a read shows). A
        stale phase only moves the scan to the other thread."""
        starting = self.state.phase == "starting"
        matcher = self.rt.env.matcher
        literal = matcher.literal_scan(starting)
        return literal if literal is not None else not matcher.scan_takes_gil(starting)

    def _stage_sink(self, gen: int) -> Callable[[str], None]:
        """Where a launch's line readers put the start-up stages its output's markers name."""

        def on_stage(stage: str) -> None:
            self.events.put(ChildStage(gen, stage))

        return on_stage

    def _keep(self, line: Line) -> bool:
        """The line reader's `keep`: `keeps` with the current matcher."""
        return keeps(self.rt.env.matcher, line)

    def _quick(self, hits: Hits) -> Quick | None:
        """The line reader's quick no: the scan's (Hits.quick), where `_keep` checks with the
        matcher that scanned (a chunk scanned before a reload is checked whole)."""
        return quick_for(self.rt.env.matcher, hits)

    def _chunk_watcher(self, gen: int) -> Callable[[Stream, bytes], None]:
        """The pumps call this per chunk (after its lines): while starting, progress evidence
        for the machine.

        Coalesced: one `ChildOutput` per stream waits on the queue at a time, and the loop
        takes the newest tail when it gets there (`_output`); and one is put per stream per
        OUTPUT_EVERY_S at most (what comes sooner waits in `_outputs`, and the loop puts it
        when it is due: `_held_outputs`). A flood then wakes the loop a few times a second,
        not per chunk (measured: ~760 steps a second in the bench's flood, each taking the
        GIL and a CPU from the readers and from a fatal line's own step), and a fatal line
        never queues behind a backlog of them. The stall watch's limits are seconds.
        """

        def on_chunk(stream: Stream, chunk: bytes) -> None:
            state = self.state  # a stale read is harmless: the machine checks gen and phase
            if state.phase != "starting" or state.gen != gen:
                return
            tail, bar, key = chunk[-TAIL_BYTES:], b"\r" in chunk, (gen, stream)
            now = time.monotonic()
            with self._outputs_lock:
                waiting = self._outputs.get(key)
                self._outputs[key] = (tail, bar or (waiting is not None and waiting[1]))
                put = key not in self._outputs_queued and self._claim(key, now)
            if put:
                self.events.put(ChildOutput(gen, stream, "", bar))

        return on_chunk

    def _held_outputs(self, now: float) -> float | None:
        """Put the held-back outputs that are due (`_chunk_watcher`); when the next one is."""
        due: list[float] = []
        with self._outputs_lock:
            for key, (_, bar) in self._outputs.items():
                if key in self._outputs_queued:
                    continue
                if self._claim(key, now):
                    self.events.put(ChildOutput(key[0], key[1], "", bar))
                else:
                    due.append(self._outputs_put.get(key, -OUTPUT_EVERY_S) + OUTPUT_EVERY_S)
        return min(due, default=None)

    def _claim(self, key: tuple[int, Stream], now: float) -> bool:
        """Under `_outputs_lock`, for a stream with no ChildOutput on the queue: whether one
        may be put now (OUTPUT_EVERY_S since its last); if so it counts as queued from now."""
        if self._outputs_put.get(key, -OUTPUT_EVERY_S) + OUTPUT_EVERY_S > now:
            return False  # due then (`_held_outputs` waits for it)
        self._outputs_queued.add(key)
        self._outputs_put[key] = now
        return True

    def _output(self, event: ChildOutput) -> ChildOutput:
        """The newest output of that stream since the event was put (see `_chunk_watcher`)."""
        key = (event.gen, event.stream)
        with self._outputs_lock:
            newest = self._outputs.pop(key, None)
            self._outputs_queued.discard(key)
            for old in [k for k in self._outputs_put if k[0] < event.gen]:
                del self._outputs_put[old]  # an older launch's: it puts no more
        if newest is None:
            return event
        return ChildOutput(event.gen, event.stream, _tail(newest[0]), newest[1])

    def _spawn(self, action: Spawn) -> None:
        """Launch when SGLang's port is free: a job stops what is left of the last tree and
        waits for the port (the old server may still hold it); `_launch` starts the child."""
        old, grace = self.child, self.rt.env.restart.stop_grace_s
        host, port = self._address()
        wait = PORT_WAIT_S if action.gen > 1 else 0.0

        def work(cancel: threading.Event) -> bool:
            if old is not None:
                # Its main process is gone, but a member that closed its pipes may still
                # hold the GPU or the port: the old tree goes before the new one starts.
                old.stop(grace)
            return ports.wait_port_free(host, port, wait, cancel)

        job = self._jobs.start(f"launch-{action.gen}",
                               work, lambda free: self._launch(action, host, port, free))
        self._launching = (action.gen, job)

    def _launch(self, action: Spawn, host: str, port: int, free: bool) -> None:
        self._launching = None
        if not free:
            raise GiveUp(f"port {port} on {host} is in use by another process; SGLang cannot "
                         "bind it (stop that process or pass another --port)",
                         GiveUpCause.PORT_BUSY)
        self._write_derived()
        self._timers.forget_before(action.gen)  # the last launch's timers would be ignored
        argv = [*self.rt.launch, *action.argv]
        env = {**{k: v for k, v in (os.environ if self.rt.child_env is None
                                    else self.rt.child_env).items() if k not in GUARD_ONLY_ENV},
               orphans.RUN_TOKEN_ENV: self._token}
        self.child = Child.spawn(argv, gen=action.gen, events=self.events,
                                 stdout_sink=self.rt.stdout, stderr_sink=self.rt.stderr,
                                 env=env, find=self._scan(), keep=self._keep,
                                 quick=self._quick,
                                 on_chunk=self._chunk_watcher(action.gen),
                                 on_stage=self._stage_sink(action.gen),
                                 warm=self._warm_pump,
                                 stops_at=self._stops_at,
                                 scan_on_reader=self._scan_on_reader)
        self._snapshot_tree()
        self.log.info("child.start", gen=action.gen, pid=self.child.pid)

    def _pick_port(self, action: PickPort) -> None:
        """A port for a `free_port` fix, free now; the machine sets the flag and launches."""
        try:
            port: int | None = ports.pick_free_port(action.avoid)
            detail = ""
        except OSError as exc:
            port, detail = None, str(exc)
        self.log.info("port.chosen", gen=action.gen, flag=action.flag, port=port,
                      avoid=list(action.avoid), **({"detail": detail} if detail else {}))
        self.events.put(PortChosen(action.gen, action.flag, port, detail))

    def _stop(self, action: Stop) -> None:
        if self._launching is not None and self._launching[0] == action.gen:
            # Still waiting for its port: the launch is called off; for the machine, the
            # child it asked for has come and gone.
            self._jobs.cancel(self._launching[1])
            self._launching = None
            self._record(NotStarted(gen=action.gen, reason=action.reason))
            self.events.put(ChildExited(action.gen, 0, 0))
            return
        child = self.child
        begun, self._terminated = self._terminated, None
        if child is None or child.gen != action.gen:
            return
        stopping = begun[2] if begun is not None and begun[0] is action else None
        # early: the SIGTERM went out from the pipe's reader, before this step (the early stop)
        self.log.info("child.stop", gen=action.gen, reason=action.reason,
                      early=stopping is not None and stopping.early)

        def work() -> None:
            report = child.stop(self.rt.env.restart.stop_grace_s, begun=stopping)
            self.log.info("child.stopped", gen=child.gen, terminated=report.terminated,
                          killed=report.killed, seconds=round(report.seconds, 3))

        stopper = threading.Thread(target=work, name=f"stop-{action.gen}", daemon=True)
        stopper.start()
        self._stoppers = [t for t in self._stoppers if t.is_alive()] + [stopper]

    def _probe(self, action: Probe) -> None:
        host, port = self._address()
        url = health.probe_url(self.rt.env.health.host or host, port, action.endpoint)
        api_key = self.state.cl.value("api_key")
        timeout = self.rt.env.health.timeout_s

        def work() -> None:
            ok, detail = health.get(url, timeout, api_key)
            self.events.put(HealthResult(action.gen, action.endpoint, ok, detail))

        threading.Thread(target=work, name="probe", daemon=True).start()

    def _notify(self, action: Notify) -> None:
        if action.ready or action.watchdog:
            self._snapshot_tree()  # at ready and at every passing liveness probe
        fields = []
        if action.status == "stopping":  # a stop signal: systemd shows "deactivating"
            fields.append("STOPPING=1")
        if action.reloading:
            fields.append("RELOADING=1")
        if action.ready:
            fields.append("READY=1")
        if action.status:
            fields.append(f"STATUS={redact_text(action.status)}")
        if action.watchdog:
            fields.append("WATCHDOG=1")
        self.notifier.send(*fields)

    def _reload(self, action: Reload) -> None:
        """Re-read a changed file: a job (preflight may probe the model, a pack compiles)."""
        self._reloads.append(action)
        if len(self._reloads) == 1:  # one at a time: each builds on the Env the last left
            self._start_reload()

    def _start_reload(self) -> None:
        action = self._reloads[0]
        self._notify(Notify(reloading=True, status="reloading"))
        env = self.rt.env
        self._jobs.start(f"reload-{action.kind}",
                         lambda _cancel: self.rt.reload(action.kind, action.path, env),
                         lambda result: self._reloaded(action, result))

    def _reloaded(self, action: Reload, result: ReloadOutcome) -> None:
        self._reloads.pop(0)
        self._record(result.record)
        if result.error is not None:
            self.log.error("reload.rejected", error=result.error)
        if result.env is not None:
            self.rt.env = result.env
        if result.cl is not None:
            self.events.put(CommandChanged(result.cl, f"{action.kind} changed"))
        ready = self.state.phase == "ready"
        self._notify(Notify(ready=ready, status="ready" if ready else "loading"))
        if self._reloads:
            self._start_reload()

    # -- helpers ---------------------------------------------------------------------------

    def _record(self, event: JournalEvent) -> None:
        """One fan-out: every listener hears the event, the journal writer last."""
        for listener in self._listeners:
            listener.record(event)

    def _write(self, event: JournalEvent) -> None:
        """The journal writer's part: append it (the disk may fail once), and log it."""
        if self.journal is not None and not self.journal.write(event):
            self.log.error("journal.write_failed", path=str(self.journal.path),
                           error=self.journal.error)
            self.journal = None  # said once; the child's output keeps flowing
        record = event.to_record()
        self.log.info(record.pop("event"), **record)

    def _address(self) -> tuple[str, int]:
        host = self.state.cl.value("host") or "127.0.0.1"
        try:
            port = int(self.state.cl.value("port") or 30000)
        except ValueError:
            port = 30000
        return host, port

    def _write_derived(self) -> None:
        cl = self.state.cl
        if cl.config_path is None or cl.yaml_data is None:
            return
        derived = Path(self.rt.env.derived_dir)
        target = Path(cl.config_path)
        if target.parent != derived or target.exists():
            return
        from sglang_guard.sglang.edits import dump_yaml  # noqa: PLC0415

        try:
            write_private(target, dump_yaml(cl.yaml_data), like=next(  # the user's YAML's mode
                (p for p, kind in self.rt.watch.items() if kind == "sglang_yaml"), None))
        except OSError as exc:
            raise ConfigError(str(derived), None, "cannot write the derived SGLang config "
                              f"({exc.strerror or exc})") from None

    def _snapshot_tree(self) -> None:
        """Record every process of the child's tree (with its start time, against pid reuse).

        A worker that called setsid() leaves the group; if the guard is then SIGKILLed, only
        this record lets the next guard find it.
        """
        child = self.child
        if child is None:
            return
        try:
            procs = proctree.tree(child.pid)  # the stop's own walk: then it is warm
            # psutil keeps the process objects this walks: the stop's walk of the machine
            # after its grace (the members forked since its snapshot, proctree.finish_stop)
            # then takes ~1 ms, not ~20.
            proctree.group_members(child.pgid)
        except psutil.Error:
            return
        with contextlib.suppress(OSError):  # only clean-up after a SIGKILLed guard needs it
            orphans.write_record(self._pidfile, child.pgid, self._token, procs)


class _Recorder(Quiet):
    """The journal writer, as the loop's last listener."""

    def __init__(self, sup: Supervisor) -> None:
        self._sup = sup

    def record(self, event: JournalEvent) -> None:
        """Write it."""
        self._sup._write(event)


TAIL_BYTES = 512
OUTPUT_EVERY_S = 0.05  # at most one ChildOutput per stream this often (`_chunk_watcher`)


def _watchdog_period(notifier: Notifier) -> float | None:
    """How often the loop pings systemd's watchdog (a third of WATCHDOG_USEC); None: not."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    if not notifier.enabled or not usec.isdigit() or int(usec) <= 0:
        return None
    return int(usec) / 1e6 / 3


def _tail(chunk: bytes) -> str:
    """The last line of a chunk (or the last redraw of a progress bar), cleaned, bounded."""
    tail = chunk[-TAIL_BYTES:].rstrip(b"\r\n")
    cut = max(tail.rfind(b"\n"), tail.rfind(b"\r"))
    return clean(tail[cut + 1:], TAIL_BYTES).strip()


def run_supervisor(rt: Runtime, cl: CommandLine, journal: JournalFile | None) -> int:
    """Supervise; a GuardError raised by an action ends the run with its status."""
    sup = Supervisor(rt, cl, journal)
    try:
        return sup.run()
    except GuardError:
        raise
    finally:
        if journal is not None:
            journal.close()


def rehearse_reading(matcher: Matcher) -> None:
    """Read the rehearsal's crash banner, a frame and its fatal line (machine.REHEARSAL_LINES)
    as one chunk, the way a pump reads a quiet stream's chunk (the scan, the line reading,
    `keeps`), in both phases, on a throwaway reader. Nothing is kept but what the matcher
    caches."""
    banner, fatal = machine.REHEARSAL_LINES
    chunk = f'{banner}\n  File "scheduler.py", line 1, in run\n{fatal}\n'.encode()
    for starting in (True, False):
        reader = LineReader(LINE_CAP, functools.partial(matcher.line_scan, starting=starting),
                            functools.partial(keeps, matcher),
                            quick=functools.partial(quick_for, matcher))
        reader.feed(chunk, reader.scan(chunk))


def quick_for(matcher: Matcher, hits: Hits) -> Quick | None:
    """The quick no `keeps(matcher, ...)` agrees with for the lines `hits` names: the scan's
    own, where `matcher` scanned (rules/quick.py: it names the ready line too); else None."""
    return hits.quick if hits.by is matcher else None


def keeps(matcher: Matcher, line: Line) -> bool:
    """Of the lines a scan hit, those the machine acts on: one a rule reads (the exact
    per-line matcher), SGLang's ready line (the reader adds every exception line that
    ends a traceback). A line that only quotes a fatal message stops here, no event."""
    if READY_LINE in line.text:
        return True
    # The chunk's scan named the rules that might match (Line.maybe): their own regexes
    # say no at once (a quoting near-miss, the common hit); a line they take is then
    # checked whole, which the machine's own asks of it find again (Matcher.candidates
    # keeps the last few answers). Only this matcher's numbers: a chunk scanned before
    # a reload numbered the old pack's rules, and is checked whole.
    if (line.maybe is not None and line.maybe_by is matcher
            and not matcher.any_of(line.text, line.ends, line.maybe)):
        return False
    return bool(matcher.candidates(line.text, line.ends))
