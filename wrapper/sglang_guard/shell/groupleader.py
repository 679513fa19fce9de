"""The leader's side of a group: rank 0's guard serves the group port.

`POST /group/join` (a worker's digest: 200 with the current launch, or 409 with what differs)
and `POST /group/beat` (a worker's heartbeat with its reports: lines, exits, a stalled start),
on a stdlib ThreadingHTTPServer bound to `[group] bind`:`port`, so it can later be mounted on
the status port. The decisions are `core/group.py`'s and the leader machine's.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from sglang_guard.core import group as core
from sglang_guard.core.actions import Action, Exit, Journal, Spawn, Stop
from sglang_guard.core.argv import CommandLine, parse_command_line
from sglang_guard.core.events import Event, PeerDown, PeerLine
from sglang_guard.core.guardconfig import GroupSection
from sglang_guard.core.machine import State
from sglang_guard.core.options import OptionTable
from sglang_guard.errors import EXIT_LEADER_LOST, GiveUp
from sglang_guard.shell.files import write_atomic
from sglang_guard.shell.groupwire import Clock
from sglang_guard.shell.logsetup import get_logger

# The leader's decisions that start a new generation; a worker's journal names the one behind
# its relaunch (event, generation, rule, node), so the leader's record is found from it.
DECISIONS = ("remediated", "restored", "crash.detected", "group.node_down", "backoff")


class LeaderLink:
    """Rank 0's guard: admits workers, hears their lines and exits, publishes each launch."""

    def __init__(self, spec: core.GroupSpec, cfg: GroupSection, digest: core.Digest,
                 derived_dir: str, *, clock: Clock = time.monotonic,
                 learned: Learned | None = None) -> None:
        self.cfg = cfg
        self.derived_dir = derived_dir
        self.learned = learned
        self._clock = clock
        self._lock = threading.Lock()
        self._roster = core.Roster(spec.nnodes, digest)
        self._launch: core.Launch | None = None
        self._cause: dict[str, Any] | None = None  # the decision behind the current generation
        self._last: dict[str, Any] | None = None  # the latest decision, until the next launch
        self._heard_exit: set[int] = set()
        self._events: queue.Queue[Event] | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.log = get_logger()
        try:
            self.httpd = http.server.ThreadingHTTPServer((cfg.bind, spec.port), self._handler())
        except OSError as exc:
            raise GiveUp(f"the group port {cfg.bind}:{spec.port} cannot be bound "
                         f"({exc.strerror or exc}); set [group] port") from None
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])

    def start(self, events: queue.Queue[Event]) -> None:
        """Serve the group port and watch for silent workers."""
        self._events = events
        loops = (("group-http", self.httpd.serve_forever), ("group-watch", self._watch))
        for name, target in loops:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self.log.info("group.leading", bind=self.cfg.bind, port=self.port,
                      nnodes=self._roster.nnodes)

    def saw_event(self, event: Event, state: State) -> None:
        """Nothing to pass on: the leader's own events are its machine's business."""

    def saw_action(self, action: Action, state: State) -> None:
        """Publish launches, readiness, decisions and the end to the workers."""
        with self._lock:
            if isinstance(action, Spawn):
                self._roster = core.launched(self._roster, action.gen, self._clock())
                self._launch = core.Launch(action.argv, state.cl.yaml_data, self.derived_dir)
                self._cause, self._last = self._last, None
            elif isinstance(action, Journal):
                event = action.record.get("event")
                if event == "ready":
                    self._roster = replace(self._roster, ready=True)
                    if self.learned is not None:
                        self.learned.reached_ready(state.cl)
                elif event in DECISIONS and self._last is None:
                    self._last = {k: action.record[k] for k in
                                  ("event", "gen", "rule", "flag", "node", "reason")
                                  if k in action.record}
            elif isinstance(action, Stop):  # no longer ready: a worker must not turn ready
                self._roster = replace(self._roster, ready=False)
            elif isinstance(action, Exit):
                self._roster = replace(self._roster, exit=(action.code, action.reason))

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
        return {"gen": r.gen, "ready": r.ready, "exit": list(r.exit) if r.exit else None,
                "launch": self._launch.to_json() if self._launch else None, "cause": self._cause}

    def join(self, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """A worker asks to join: 200 with the current launch, or 409 with what differs."""
        rank = int(body["rank"])
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
        rank, gen = int(body["rank"]), int(body.get("gen", 0))
        with self._lock:
            if rank not in self._roster.members:
                return 410, {"reason": "this leader does not know the node (it restarted)"}
            self._roster = core.beat(self._roster, rank, gen, str(body.get("phase", "")),
                                     self._clock())
            current = self._roster.gen
            out: list[Event] = []
            for report in body.get("reports", []):
                if int(report.get("gen", -1)) != current:
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

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        link = self
        routes = {"/group/join": link.join, "/group/beat": link.beat}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                route = routes.get(self.path)
                try:
                    size = int(self.headers.get("Content-Length") or 0)
                    body = json.loads(self.rfile.read(size) or b"{}")
                    status, data = route(body) if route else (404, {"reason": "no such path"})
                except (ValueError, KeyError, TypeError) as exc:
                    status, data = 400, {"reason": f"malformed request: {exc}"}
                payload = core.encode(data)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass  # the guard logs what matters itself

        return Handler


# -- what the group learned, kept across a group recreation ---------------------------------


class Learned:
    """The leader's last command line that reached ready after a fix, in the state dir.

    A group recreated by its orchestrator (LWS after a give-up) starts from the user's
    command line again; with the state dir on a persistent volume, the leader launches the
    fixed one at once when its inputs are the ones the fix was learned from.
    """

    NAME = "group-learned.json"

    def __init__(self, state_dir: str, digest: core.Digest, first: CommandLine) -> None:
        self.path = Path(state_dir) / self.NAME
        self.key = hashlib.sha256(core.encode(digest.to_json())).hexdigest()
        self.first = first

    def replay(self, options: OptionTable) -> CommandLine | None:
        """The learned command line for these inputs (None: nothing learned, or other inputs)."""
        try:
            data = json.loads(self.path.read_text())
            if data.get("inputs") != self.key:
                return None
            launch = core.Launch.from_json(data)
        except (OSError, ValueError, AttributeError):
            return None
        return parse_command_line(launch.argv, options, launch.yaml_data)

    def reached_ready(self, cl: CommandLine) -> None:
        """Keep `cl` when it is not the user's own command line; forget it when it is."""
        with contextlib.suppress(OSError):  # a read-only state dir: nothing is kept
            if cl.argv == self.first.argv:
                self.path.unlink(missing_ok=True)
                return
            launch = core.Launch(cl.argv, cl.yaml_data, "")
            write_atomic(self.path, json.dumps({"inputs": self.key, **launch.to_json()}))
