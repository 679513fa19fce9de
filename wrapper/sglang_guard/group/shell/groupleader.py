"""The leader's side of a group: rank 0's guard serves the group port.

`POST /group/join` (a worker's digest: 200 with the current launch, or 409 with what differs)
and `POST /group/beat` (a worker's heartbeat with its reports: lines, exits, a stalled start),
on a stdlib ThreadingHTTPServer bound to `[group] bind`:`port`, so it can later be mounted on
the status port. The decisions are `group/group.py`'s and the leader machine's.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from sglang_guard.common.outcomes import (
    BackingOff,
    CrashDetected,
    GaveUp,
    GiveUpCause,
    GroupRejected,
    JournalEvent,
    LearnedRefused,
    LogFix,
    NodeDown,
    Ready,
    Restored,
    UndoFix,
)
from sglang_guard.common.shell.files import read_bytes, write_atomic
from sglang_guard.common.shell.logsetup import get_logger
from sglang_guard.config.guardconfig import GroupSection
from sglang_guard.errors import EXIT_LEADER_LOST, GiveUp, GuardError
from sglang_guard.group import group as core
from sglang_guard.group import groupauth as auth
from sglang_guard.group.shell.groupwire import Clock
from sglang_guard.rules.packcheck import INTERNAL_PORTS, is_denied
from sglang_guard.sglang.argv import CONFIG_FLAG, CommandLine
from sglang_guard.sglang.options import OptionTable
from sglang_guard.status.shell.statusserver import (
    CappedServer,
    Connections,
    connection_cap,
    tracker,
)
from sglang_guard.supervise.actions import Action, Exit, Journal, Spawn, Stop
from sglang_guard.supervise.events import Event, PeerDown, PeerLine
from sglang_guard.supervise.machine import State
from sglang_guard.supervise.shell.observer import Quiet

# The leader's decisions that start a new generation; a worker's journal names the one behind
# its relaunch (event, generation, rule, node), so the leader's record is found from it.
DECISIONS = (LogFix, UndoFix, Restored, CrashDetected, NodeDown, BackingOff)
CAUSE_KEYS = ("event", "gen", "rule", "flag", "node", "reason")  # what the wire carries of it
REQUEST_TIMEOUT_S = 10.0  # the longest a peer may take to send one request
NOTE_EVERY_S = 10.0  # refused requests of one reason are journaled at most this often
Record = Callable[[JournalEvent], object]  # the journal's write
ABSENT = "<absent>"


class LeaderLink(Quiet):
    """Rank 0's guard: admits workers, hears their lines and exits, publishes each launch."""

    def __init__(self, spec: core.GroupSpec, cfg: GroupSection, digest: core.Digest,
                 derived_dir: str, *, clock: Clock = time.monotonic,
                 learned: Learned | None = None, secret: bytes | None = None,
                 record: Record | None = None) -> None:
        self.cfg = cfg
        self.derived_dir = derived_dir
        self.learned = learned
        self.secret = secret
        self._clock = clock
        self._nonces = auth.Nonces()
        self._record = record
        self._noted: dict[str, tuple[float, int]] = {}  # reason -> (last journaled, suppressed)
        self._lock = threading.Lock()
        self._roster = core.Roster(spec.nnodes, digest)
        self._launch: core.Launch | None = None
        self._cause: dict[str, Any] | None = None  # the decision behind the current generation
        self._last: dict[str, Any] | None = None  # the latest decision, until the next launch
        self._heard_exit: set[int] = set()
        self._gave_up = GiveUpCause.OTHER  # the cause of the leader's give-up, once journaled
        self._events: queue.Queue[Event] | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.log = get_logger()
        self.bind = spec.leader if cfg.bind in ("", "auto") else cfg.bind
        try:
            self.httpd = _server(self.bind, spec.port, self._handler(), self._noted_error)
        except OSError as exc:
            raise GiveUp(f"the group port {self.bind}:{spec.port} cannot be bound "
                         f"({exc.strerror or exc}); set [group] port or bind") from None
        self.port = int(self.httpd.server_address[1])

    def start(self, events: queue.Queue[Event]) -> None:
        """Serve the group port and watch for silent workers."""
        self._events = events
        loops = (("group-http", self.httpd.serve_forever), ("group-watch", self._watch))
        for name, target in loops:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self.log.info("group.leading", bind=self.bind, port=self.port,
                      nnodes=self._roster.nnodes, authenticated=self.secret is not None)

    def saw_event(self, event: Event, state: State) -> None:
        """Nothing to pass on: the leader's own events are its machine's business."""

    def saw_action(self, action: Action, state: State) -> None:
        """Publish launches, readiness, decisions and the end to the workers."""
        with self._lock:
            if isinstance(action, Spawn):
                self._roster = core.launched(self._roster, action.gen, self._clock())
                self._launch = core.masked_launch(state.cl, self.derived_dir)
                self._cause, self._last = self._last, None
            elif isinstance(action, Journal):
                event = action.record
                if isinstance(event, Ready):
                    self._roster = replace(self._roster, ready=True)
                    if self.learned is not None:
                        self.learned.reached_ready(state.cl)
                elif isinstance(event, DECISIONS) and self._last is None:
                    record = event.to_record()  # the wire carries the journal's spelling
                    self._last = {k: record[k] for k in CAUSE_KEYS if k in record}
            elif isinstance(action, Stop):  # no longer ready: a worker must not turn ready
                self._roster = replace(self._roster, ready=False)
            elif isinstance(action, Exit):
                self._roster = replace(self._roster, exit=(action.code, action.reason),
                                       exit_cause=self._gave_up)

    def record(self, event: JournalEvent) -> None:
        """A give-up's cause: the workers give up for the same one."""
        if isinstance(event, GaveUp):
            with self._lock:
                self._gave_up = event.cause

    def close(self) -> None:
        """Let every worker hear how the leader ended (bounded), then stop serving."""
        with self._lock:
            if self._roster.exit is None:
                self._roster = replace(self._roster, exit=(EXIT_LEADER_LOST, "the leader ended"))
            waiting = set(self._roster.members)
        deadline = self._clock() + min(3 * self.cfg.heartbeat_s + 1.0, self.cfg.leader_lost_s)
        while waiting - self._heard_exit and self._clock() < deadline:
            self._stop.wait(0.05)
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        for thread in self._threads:
            thread.join(10)

    # -- inside --------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.wait(self.cfg.heartbeat_s / 2):
            with self._lock:
                self._roster, down = core.overdue(self._roster, self._clock(),
                                                  self.cfg.worker_lost_s, self.cfg.join_timeout_s)
                gen = self._roster.gen
            for rank, why, stage in down:
                self._put(PeerDown(gen, rank, why, stage))

    def _put(self, event: Event) -> None:
        if self._events is not None:
            self._events.put(event)

    def _answer(self) -> dict[str, Any]:
        r = self._roster
        return {"gen": r.gen, "ready": r.ready,
                "exit": [*r.exit, r.exit_cause.value] if r.exit else None,
                "launch": self._launch.to_json() if self._launch else None, "cause": self._cause}

    def join(self, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """A worker asks to join: 200 with the current launch, or 409 with what differs."""
        rank = auth.whole(body.get("rank"), "rank")
        if not isinstance(body.get("digest"), dict):
            raise ValueError("digest: expected an object")
        digest = core.Digest.from_json(body["digest"])
        with self._lock:
            self._roster, problems = core.join(self._roster, rank, digest, self._clock())
            answer = self._answer()
        if problems:
            self.log.error("group.refused", node=rank, differs=problems)
            return 409, {"refused": problems}
        self.log.info("group.joined", node=rank, gen=answer["gen"])
        return 200, answer

    def beat(self, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """A worker's heartbeat, with what it saw since the last one."""
        rank, gen = auth.whole(body.get("rank"), "rank"), auth.whole(body.get("gen", 0), "gen")
        reports = body.get("reports", [])
        if not isinstance(reports, list) or not all(isinstance(r, dict) for r in reports):
            raise ValueError("reports: expected a list of objects")
        with self._lock:
            if rank not in self._roster.members:
                return 410, {"reason": "this leader does not know the node (it restarted)"}
            self._roster = core.beat(self._roster, rank, gen, str(body.get("phase", "")),
                                     self._clock())
            current = self._roster.gen
            out: list[Event] = []
            for report in reports:
                if auth.whole(report.get("gen", -1), "reports.gen") != current:
                    continue  # about a generation that is over already
                out.extend(self._report(rank, current, report))
            if self._roster.exit is not None:
                self._heard_exit.add(rank)
            answer = self._answer()
        for event in out:
            self._put(event)
        return 200, answer

    def _report(self, rank: int, gen: int, report: Mapping[str, Any]) -> list[Event]:
        kind = report.get("kind")
        if kind == "line":
            return [PeerLine(gen, rank, str(report.get("text", "")))]
        if (gen, rank) in self._roster.reported:
            return []
        self._roster = core.mark_reported(self._roster, gen, rank)
        if kind == "exit":
            why = f"SGLang on node {rank} exited with status {report.get('returncode')}"
        else:
            stage = str(report.get("stage") or "start-up")
            return [PeerDown(gen, rank, f"node {rank} stalled in {stage}", stage)]
        return [PeerDown(gen, rank, why)]

    def rejected(self, peer: str, path: str, status: int, reason: str) -> None:
        """A request refused (unauthenticated, stale, malformed): journaled, never printed.

        One record per reason every NOTE_EVERY_S; the ones in between are counted in it.
        """
        now = self._clock()
        with self._lock:
            last, suppressed = self._noted.get(reason, (-NOTE_EVERY_S, 0))
            if now - last < NOTE_EVERY_S:
                self._noted[reason] = (last, suppressed + 1)
                return
            self._noted[reason] = (now, 0)
        if self._record is not None:
            self._record(GroupRejected(peer=peer, path=path[:100], status=status,
                                       reason=reason[:300], suppressed=suppressed))

    def _noted_error(self, peer: str, exc: BaseException) -> None:
        self.rejected(peer, "", 400, f"{type(exc).__name__}: {exc}")

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        link = self
        routes = {"/group/join": link.join, "/group/beat": link.beat}

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = REQUEST_TIMEOUT_S  # a peer that stops sending loses its connection

            def handle_one_request(self) -> None:
                tracker(self.server).idle(self.request)  # closable for a new connection
                super().handle_one_request()

            def parse_request(self) -> bool:
                ok = super().parse_request()
                if ok:
                    tracker(self.server).busy(self.request)
                return ok

            def do_POST(self) -> None:
                peer = str(self.client_address[0])
                try:
                    size = auth.content_length(self.headers.get("Content-Length"))
                except OverflowError as exc:  # refused at the header: the body is never read
                    self._fail(peer, 413, str(exc))
                    return
                except ValueError as exc:
                    self._fail(peer, 400, str(exc))
                    return
                raw = self.rfile.read(size)
                if len(raw) < size:
                    self._fail(peer, 400, "the body ended before its Content-Length")
                    return
                nonce = self.headers.get(auth.H_NONCE) or ""
                if link.secret is not None:
                    refused = auth.check_request(link.secret, self.headers, self.path,
                                                 body=raw, now=time.time(),
                                                 nonces=link._nonces)
                    if refused is not None:
                        self._fail(peer, *refused)
                        return
                route = routes.get(self.path)
                try:
                    body = auth.strict_json(raw)
                    status, data = route(body) if route else (404, {"reason": "no such path"})
                except Exception as exc:  # whatever a peer sent: 400, journaled
                    status, data = 400, {"reason": "malformed request"}
                    link.rejected(peer, self.path, 400, f"{type(exc).__name__}: {exc}")
                self._send(status, data, nonce)

            def _fail(self, peer: str, status: int, reason: str) -> None:
                link.rejected(peer, self.path, status, reason)
                self.close_connection = True
                self._send(status, {"reason": reason}, None)

            def _send(self, status: int, data: Mapping[str, Any], nonce: str | None) -> None:
                payload = core.encode(data)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                if link.secret is not None and nonce is not None:  # only an authenticated ask
                    for key, value in auth.reply_headers(link.secret, self.path, nonce,
                                                         status=status, body=payload,
                                                         now=time.time()).items():
                        self.send_header(key, value)
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass  # the guard journals what matters itself

        return Handler


def _server(host: str, port: int, handler: type[http.server.BaseHTTPRequestHandler],
            on_error: Callable[[str, BaseException], None]) -> http.server.ThreadingHTTPServer:
    """The group port's server: daemon threads, errors journaled instead of printed."""

    class Server(CappedServer, http.server.ThreadingHTTPServer):
        """At most `connection_cap()` connections, the oldest idle one closed for a new one
        (as the status port): a peer holding connections open costs the guard no fds."""

        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        request_queue_size = 64
        connections = Connections(connection_cap())

        def handle_error(self, request: Any, client_address: Any) -> None:
            on_error(str(client_address[0]) if client_address else "?",
                     sys.exc_info()[1] or RuntimeError("unknown"))

    return Server((host, port), handler)


# -- what the group learned, kept across a group recreation ---------------------------------


class Learned:
    """The leader's last command line that reached ready after a fix, in the state dir.

    A group recreated by its orchestrator (LWS after a give-up) starts from the user's
    command line again; with the state dir on a persistent volume, the leader launches the
    fixed one at once when its inputs are the ones the fix was learned from.
    """

    NAME = "group-learned.json"

    def __init__(self, state_dir: str, digest: core.Digest, first: CommandLine, *,
                 allow_set: Collection[str] = (), record: Record | None = None) -> None:
        self.path = Path(state_dir) / self.NAME
        self.key = hashlib.sha256(core.encode(digest.to_json())).hexdigest()
        self.first = first
        self.allow_set = frozenset(allow_set)
        self._record = record

    def replay(self, options: OptionTable) -> CommandLine | None:
        """The learned command line for these inputs (None: nothing learned, other inputs, or
        a file that no rule could have written: journaled `learned.refused`)."""
        with contextlib.suppress(OSError):  # one an older guard wrote 0644: private now
            if self.path.lstat().st_mode & 0o077 and not self.path.is_symlink():
                self.path.chmod(0o600)
        try:
            data = auth.strict_json(read_bytes(self.path, limit=auth.MAX_BODY, nofollow=True))
            if data.get("inputs") != self.key:
                return None
            launch = core.Launch.from_json(data)
            # the file holds the secrets masked: this guard's own command line fills them
            cl = core.unmask(launch, options, self.first)
        except OSError:
            return None
        except (ValueError, AttributeError, GuardError) as exc:
            return self._refuse(f"unreadable: {exc}")
        if cl.problems:
            return self._refuse("SGLang " + str(options.sglang_version) + " would reject it: "
                                + "; ".join(cl.problems))
        before, after = self.first.effective(), cl.effective()
        for flag in sorted(set(before) | set(after)):
            if flag == CONFIG_FLAG or before.get(flag, ABSENT) == after.get(flag, ABSENT):
                continue
            if is_denied(flag) and flag not in self.allow_set and flag not in INTERNAL_PORTS:
                return self._refuse(f"it changes {flag}, which is on the deny list "
                                    "(rules/packcheck.py): no rule may change it")
        return cl

    def _refuse(self, why: str) -> CommandLine | None:
        if self._record is not None:
            self._record(LearnedRefused(path=str(self.path), reason=why))
        return None

    def reached_ready(self, cl: CommandLine) -> None:
        """Keep `cl` (secrets masked, 0600) when it is not the user's own command line; forget
        it when it is."""
        with contextlib.suppress(OSError):  # a read-only state dir: nothing is kept
            if cl.argv == self.first.argv:
                self.path.unlink(missing_ok=True)
                return
            launch = core.masked_launch(cl, "")
            write_atomic(self.path, json.dumps({"inputs": self.key, **launch.to_json()}),
                         mode=0o600)
