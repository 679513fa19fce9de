"""The guard's own HTTP port: /metrics, /livez, /readyz, /startupz and /status.

Up from the guard's first second (before preflight, while SGLang loads), on a thread of
its own; it only reads what the loop's observer hooks folded in. Binding beyond loopback
needs `[status] allow_remote`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglang_guard.common.outcomes import FixKind
from sglang_guard.common.shell.files import write_atomic
from sglang_guard.common.shell.logsetup import get_logger
from sglang_guard.config.guardconfig import TERMINATION_LOG, StatusSection, parse_listen
from sglang_guard.errors import EXIT_GIVE_UP, EXIT_USAGE, GuardError, InputError, Refused
from sglang_guard.sglang.redact import redact_text
from sglang_guard.status import status as model
from sglang_guard.supervise.actions import Stop
from sglang_guard.supervise.events import Tick
from sglang_guard.supervise.shell.notify import Notifier
from sglang_guard.supervise.shell.observer import Quiet

if TYPE_CHECKING:
    from sglang_guard.common.outcomes import JournalEvent
    from sglang_guard.status.shell.metrics import Metrics
    from sglang_guard.status.shell.statusserver import StatusServer
    from sglang_guard.supervise.actions import Action
    from sglang_guard.supervise.events import Event
    from sglang_guard.supervise.machine import Env, State

PATHS = ("/metrics", "/livez", "/readyz", "/startupz", "/status")
# Which Kubernetes probe goes to which path (deploy/kubernetes/ and the README use these).
PROBES = {"startupProbe": "/startupz", "readinessProbe": "/readyz", "livenessProbe": "/livez"}
LIVEZ_TICK = "status.livez"  # a Tick no launch owns: the machine ignores it, the loop takes it
LIVEZ_WAIT_S = 5.0
SGLANG_DEFAULT_PORT = 30000
ADDRESS_FILE = "status-address"  # in the state dir: where this guard's status port listens
TERMINATION_MAX = 4096  # what Kubernetes keeps of a termination message
ENV_LISTEN = "SGLANG_GUARD_STATUS_LISTEN"
ENV_ALLOW_REMOTE = "SGLANG_GUARD_STATUS_ALLOW_REMOTE"


class _NoMetrics:
    """The metrics of a guard whose status port is off: prometheus-client is not imported."""

    def known_remediations(self, labels: Iterable[tuple[str, str, str, str]]) -> None:
        """Ignore."""

    def build(self, sglang_version: str | None) -> None:
        """Ignore."""

    def count(self, counts: model.Counts) -> None:
        """Ignore."""

    def show(self, snap: model.Snapshot) -> None:
        """Ignore."""


class StatusBoard(Quiet):
    """The loop's listener for the status port; the HTTP threads read what it holds."""

    def __init__(self, *, metrics: bool = True) -> None:
        self._lock = threading.Condition()
        self._snap = model.Snapshot(since=time.monotonic())
        self.metrics: Metrics | _NoMetrics = _NoMetrics()
        if metrics:
            from sglang_guard.status.shell.metrics import Metrics  # noqa: PLC0415 - only when served

            self.metrics = Metrics(self._phase_seconds)
        self._events: queue.Queue[Event] | None = None
        self._matcher: object = None
        self._version: str | None = None
        self._steps = 0
        self.address: tuple[str, int] | None = None  # where the port listens, once it does
        self.announce_to: str | None = None  # the state dir that gets `status-address`
        self._failed = False

    # -- the loop's hooks (supervise.shell.observer.Listener) --------------------------------------

    def start(self, events: queue.Queue[Event]) -> None:
        """The loop's queue: /livez puts a tick there and waits for the loop to take it."""
        self._events = events
        if self.address is not None:  # said once supervision starts: an error before it
            # (bad input, refusal) stays the only line on stderr
            get_logger().info("status.listening", host=self.address[0], port=self.address[1])
            if self.announce_to is not None:
                announce(self, self.announce_to)

    def stepped(self, state: State, env: Env, actions: Sequence[Action]) -> None:
        """The machine stepped: phase, Stop causes, and the rule packs' labels at zero."""
        with self._lock, self._never_raise("step"):
            snap = self._snap
            for action in actions:
                if isinstance(action, Stop):
                    snap = model.on_stop(snap, action.cause)
            self._set(model.on_phase(snap, state.phase, time.monotonic()))
            if env.sglang_version != self._version:
                self.metrics.build(env.sglang_version)
            self._version = env.sglang_version
            if env.matcher is not self._matcher:
                self._matcher = env.matcher
                self.metrics.known_remediations(
                    ("log", rule.id, flag, rule.action) for rule in env.matcher.rules
                    if rule.action in (FixKind.DROP_FLAG, FixKind.SET_FLAG)
                    for flag in rule.flags)
        with self._lock:  # /livez counts loop steps, whatever the fold made of this one
            self._steps += 1
            self._lock.notify_all()

    def record(self, event: JournalEvent) -> None:
        """Fold one journal event in; count it."""
        with self._lock, self._never_raise("record"):
            snap, counts = model.on_record(self._snap, event, time.monotonic(), time.time())
            self.metrics.count(counts)
            self._set(snap)

    # -- for a stage watcher (start-hang work) ------------------------------------------------

    def set_stage(self, stage: str | None) -> None:
        """SGLang entered a loading stage: the phase reads `loading`, /status names it."""
        with self._lock:
            self._set(model.on_stage(self._snap, stage, time.monotonic()))

    def stalled(self, stage: str) -> None:
        """A stage made no progress within its limit: /startupz answers 503 from now on."""
        with self._lock:
            self._set(model.on_stalled(self._snap, stage))

    def refused(self, reason: str, label: str) -> None:
        """The guard stopped on an error of its own (policy refusal, bad input, busy port)."""
        with self._lock:
            self._set(replace(self._snap, gave_up=reason, phase="stopped"))
            self.metrics.count(model.Counts(give_up=label))

    # -- what the HTTP threads read ---------------------------------------------------------

    def snapshot(self) -> model.Snapshot:
        """The current snapshot."""
        with self._lock:
            return self._snap

    def document(self) -> dict[str, Any]:
        """The /status JSON."""
        with self._lock:
            doc = model.public(self._snap, time.monotonic(), self._version)
        if self.address is not None:  # where this port listens (a derived or any free port)
            doc["listen"] = {"host": self.address[0], "port": self.address[1]}
        return doc

    def alive(self, timeout: float = LIVEZ_WAIT_S) -> bool:
        """Whether the loop takes an event within `timeout` (before the loop: preflight runs)."""
        events = self._events
        if events is None:
            return self._snap.phase == "preflight"
        with self._lock:
            seen = self._steps
        events.put(Tick(LIVEZ_TICK, -1))
        with self._lock:
            return self._lock.wait_for(lambda: self._steps > seen, timeout)

    @contextlib.contextmanager
    def _never_raise(self, hook: str) -> Iterator[None]:
        """A bug in the status fold is logged once; it never stops supervising SGLang."""
        try:
            yield
        except Exception as exc:  # the loop must go on, whatever this was
            if not self._failed:
                self._failed = True
                get_logger().error("status.failed", hook=hook,
                                   error=f"{type(exc).__name__}: {exc}")

    def _set(self, snap: model.Snapshot) -> None:
        if snap is self._snap:  # most loop steps change nothing: no gauge is touched
            return
        self._snap = snap
        self.metrics.show(snap)

    def _phase_seconds(self) -> float:
        return max(0.0, time.monotonic() - self._snap.since)


def sglang_port(argv: Sequence[str]) -> int:
    """SGLang's --port as the command line gives it (30000, SGLang's default, when absent)."""
    port = SGLANG_DEFAULT_PORT
    for i, tok in enumerate(argv):
        text = tok.split("=", 1)[1] if tok.startswith("--port=") else (
            argv[i + 1] if tok == "--port" and i + 1 < len(argv) else None)
        if text is not None and text.isascii() and text.isdigit() and len(text) <= 5:
            port = int(text)
    return port


def address(section: StatusSection, argv: Sequence[str] = ()) -> tuple[str, int] | None:
    """Where to listen: $SGLANG_GUARD_STATUS_LISTEN over `[status] listen`; None when off.

    "auto" (the default) derives the port from SGLang's --port in `argv`.
    """
    listen = os.environ.get(ENV_LISTEN)
    if listen is None or listen.strip().lower() == "auto":
        return replace(section, listen=listen or section.listen).address(sglang_port(argv))
    remote = section.allow_remote or os.environ.get(ENV_ALLOW_REMOTE, "") in ("1", "true")
    try:
        return parse_listen(listen, allow_remote=remote)
    except ValueError as exc:
        raise InputError(f"${ENV_LISTEN}: {exc}") from None


def is_auto(section: StatusSection) -> bool:
    """The port is the derived default: when taken, any free one will do (it is announced)."""
    listen = os.environ.get(ENV_LISTEN)
    return (listen or section.listen).strip().lower() == "auto"


def start(board: StatusBoard, where: tuple[str, int] | None, *, any_port: bool = False
          ) -> StatusServer | None:
    """Serve `board` at `where`; a port in use is logged, not fatal (`any_port`: another
    free port is taken, and announced)."""
    if where is None:
        return None
    try:
        # http.server (and the ssl it imports) only where the port is on
        from sglang_guard.status.shell.statusserver import StatusServer  # noqa: PLC0415

        server = StatusServer(board, *where)
    except OSError as exc:  # supervising SGLang matters more than being scraped
        if any_port and exc.errno == errno.EADDRINUSE:
            get_logger().info("status.port_taken", listen=f"{where[0]}:{where[1]}",
                              note="another guard on this host has it: any free port instead")
            return start(board, (where[0], 0))
        get_logger().error("status.unavailable", listen=f"{where[0]}:{where[1]}",
                           error=exc.strerror or str(exc))
        return None
    board.address = (str(server.address[0]), int(server.address[1]))
    return server


def announce(board: StatusBoard, state_dir: str) -> None:
    """Say where the port listens: `status-address` in the state dir, and systemd STATUS=.

    (The journal's status.listening record is the runner's.) A state dir that cannot be
    written is no reason to stop.
    """
    if board.address is None:
        return
    host, port = board.address
    text = json.dumps({"host": host, "port": port, "pid": os.getpid()}) + "\n"
    with contextlib.suppress(OSError):
        write_atomic(Path(state_dir) / ADDRESS_FILE, text)
    notifier = Notifier()
    if notifier.enabled:
        notifier.send(f"STATUS=starting; status port {host}:{port}")
        notifier.close()


def termination_message(path: str, line: str) -> None:
    """Write the one-line reason where Kubernetes reads it (`kubectl describe pod`).

    The default path is written only where it exists (a container that Kubernetes runs);
    another configured path is created.
    """
    if not path or (path == TERMINATION_LOG and not Path(path).exists()):
        return
    text = redact_text(" ".join(line.split()))[:TERMINATION_MAX]
    try:
        with Path(path).open("w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    except OSError as exc:
        get_logger().error("termination_message.failed", path=path,
                           error=exc.strerror or str(exc))


@contextlib.contextmanager
def serving(section: StatusSection, argv: Sequence[str] = ()) -> Iterator[StatusBoard]:
    """The status port for one guard run; the termination message when it ends in a give-up."""
    where = address(section, argv)
    # Off: the snapshot is still kept (for the termination message), the metrics are not.
    board = StatusBoard(metrics=where is not None)
    server = start(board, where, any_port=is_auto(section))
    try:
        yield board
    except GuardError as exc:
        if board.snapshot().gave_up is None:  # a give-up the loop journaled is counted
            board.refused(str(exc), "refused" if isinstance(exc, Refused) else "other")
        kind = "refused" if isinstance(exc, Refused) else "gave up" if (
            exc.exit_code == EXIT_GIVE_UP) else "error"
        termination_message(section.termination_log, f"sglang-guard {kind}: {exc}")
        raise
    else:
        snap = board.snapshot()
        if snap.exit_code == EXIT_GIVE_UP and snap.gave_up:
            termination_message(section.termination_log, f"sglang-guard gave up: {snap.gave_up}")
        elif snap.exit_code == EXIT_USAGE and snap.gave_up:  # SGLang's parser rejected the line
            termination_message(section.termination_log, f"sglang-guard error: {snap.gave_up}")
    finally:
        if server is not None:
            server.close()
