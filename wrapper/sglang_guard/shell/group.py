"""The multi-node group's wire: the leader's HTTP endpoint and a worker's heartbeat.

The leader (rank 0's guard) serves `POST /group/join` and `POST /group/beat` on its group port
(`[group] bind`:`port`, loopback unless configured) with a stdlib ThreadingHTTPServer, so it
can later be mounted on the status port. What either side decides is in `core/group.py`;
here are only the sockets, the threads and the events they put on the supervision loop's
queue. The supervisor calls a link's `saw_event` before each step and `saw_action` before
each action; nothing else of the loop knows about the group.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import http.server
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from sglang_guard.core import group as core
from sglang_guard.core.actions import Action, Exit, Journal, Spawn, Stop
from sglang_guard.core.argv import CommandLine, parse_command_line
from sglang_guard.core.events import (
    ChildExited,
    ChildLine,
    Event,
    GroupExit,
    GroupRelaunch,
    PeerDown,
    PeerLine,
)
from sglang_guard.core.facts import GpuFacts
from sglang_guard.core.guardconfig import GroupSection
from sglang_guard.core.machine import Env, State
from sglang_guard.core.options import OptionTable
from sglang_guard.core.rules import Matcher
from sglang_guard.errors import EXIT_LEADER_LOST, EXIT_REFUSED, GiveUp, LeaderLost, Refused
from sglang_guard.shell.files import write_atomic
from sglang_guard.shell.logsetup import get_logger
from sglang_guard.shell.reloader import ReloadOutcome

Clock = Callable[[], float]
Reload = Callable[[str, "str | None", Env], ReloadOutcome]
# The leader's decisions that start a new generation; a worker's journal names the one behind
# its relaunch (event, generation, rule, node), so the leader's record is found from it.
DECISIONS = ("remediated", "restored", "crash.detected", "group.node_down", "backoff")
STALLED = "start.stalled"  # the start-hang watcher's event (issue 12): a worker passes it on


class Link(Protocol):
    """What the supervisor calls: start with its queue, see events and actions, close."""

    def start(self, events: queue.Queue[Event]) -> None:
        """Start the link's threads; they put events on `events`."""

    def saw_event(self, event: Event, state: State) -> None:
        """An event is about to be stepped."""

    def saw_action(self, action: Action, state: State) -> None:
        """An action is about to be carried out (`state`: the machine's state after the step)."""

    def close(self) -> None:
        """Stop the threads (the leader first lets its workers hear how it ended)."""


# -- facts for the digest -------------------------------------------------------------------


def model_config_hash(model_path: str | None, revision: str | None) -> str | None:
    """sha256 of the model's config.json (a local directory, else the local hub cache)."""
    if not model_path:
        return None
    local = Path(model_path).expanduser() / "config.json"
    path: str | None = str(local) if local.is_file() else None
    if path is None:
        try:
            from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415
        except ImportError:
            return None
        with contextlib.suppress(Exception):  # an id the cache cannot hold: unknown
            cached = try_to_load_from_cache(model_path, "config.json", revision=revision)
            path = cached if isinstance(cached, str) else None
    if path is None:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def gpu_count(gpu: GpuFacts) -> int | None:
    """The GPUs this node's SGLang sees: CUDA_VISIBLE_DEVICES, else NVML; None when unknown."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    if gpu.source != "nvml":
        return None
    try:
        import pynvml  # noqa: PLC0415

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # any NVML failure: cannot tell
        return None


def local_digest(cl: CommandLine, sglang: str | None, gpu: GpuFacts) -> core.Digest:
    """This node's digest of the inputs its launch is decided from."""
    return core.make_digest(cl, model_config_hash(cl.value("model_path"), cl.value("revision")),
                            sglang, gpu.sm, gpu_count(gpu))


# -- HTTP -----------------------------------------------------------------------------------


def post(host: str, port: int, path: str, body: Mapping[str, Any], timeout: float
         ) -> tuple[int, dict[str, Any]] | None:
    """(status, JSON answer) of one POST; None when the peer cannot be reached."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, core.encode(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read() or b"{}")
        return resp.status, data if isinstance(data, dict) else {}
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()


def _reply(data: Mapping[str, Any]) -> core.Reply:
    launch = data.get("launch")
    exit_ = data.get("exit")
    return core.Reply(
        gen=int(data.get("gen", 0)),
        launch=core.Launch.from_json(launch) if isinstance(launch, dict) else None,
        ready=bool(data.get("ready")),
        exit=(int(exit_[0]), str(exit_[1])) if isinstance(exit_, list) else None,
        cause=data.get("cause") if isinstance(data.get("cause"), dict) else None,
    )


# -- the leader -----------------------------------------------------------------------------


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


# -- a worker -------------------------------------------------------------------------------


class WorkerLink:
    """A worker's guard: joins its leader, reports its lines and exits, follows the answers."""

    def __init__(self, spec: core.GroupSpec, cfg: GroupSection, digest: core.Digest, *,
                 options: OptionTable, matcher: Matcher, derived_dir: str,
                 clock: Clock = time.monotonic) -> None:
        self.spec = spec
        self.cfg = cfg
        self.digest = digest
        self.options = options
        self.matcher = matcher
        self.derived_dir = derived_dir
        self._clock = clock
        self._follower = core.Follower(spec.rank, 0, clock(), cfg.leader_lost_s, derived_dir)
        self._outbox: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._launching = 0  # the group generation the next Spawn belongs to
        self._gen_of: dict[int, int] = {}  # local launch number -> group generation
        self._events: queue.Queue[Event] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.log = get_logger()

    def join(self) -> CommandLine:
        """Join the leader (bounded by join_timeout_s); the command line to launch first."""
        deadline = self._clock() + self.cfg.join_timeout_s
        body = {"rank": self.spec.rank, "digest": self.digest.to_json()}
        heard = False
        while True:
            got = post(self.spec.leader, self.spec.port, "/group/join", body,
                       timeout=max(2.0, self.cfg.heartbeat_s * 2))
            if got is not None and got[0] == 409:
                raise Refused(f"the group leader at {self.spec.leader}:{self.spec.port} refused "
                              f"node {self.spec.rank}: " + "; ".join(got[1].get("refused", [])))
            if got is not None and got[0] == 200:
                heard = True
                reply = _reply(got[1])
                if reply.launch is not None and reply.exit is None:
                    self._follower = core.Follower(self.spec.rank, reply.gen, self._clock(),
                                                   self.cfg.leader_lost_s, self.derived_dir)
                    self._launching = reply.gen
                    self.log.info("group.joined", leader=self.spec.leader, gen=reply.gen)
                    return core.worker_command_line(reply.launch, self.spec.rank,
                                                    self.options, self.derived_dir)
            if self._clock() > deadline:
                what = "has not launched" if heard else "did not answer"
                raise LeaderLost(f"the group leader at {self.spec.leader}:{self.spec.port} "
                                 f"{what} within {self.cfg.join_timeout_s:g}s "
                                 "(group.join_timeout_s)")
            self._stopping.wait(min(self.cfg.heartbeat_s, 1.0))

    def start(self, events: queue.Queue[Event]) -> None:
        """Start the heartbeat thread."""
        self._events = events
        self._thread = threading.Thread(target=self._beat_loop, name="group-beat", daemon=True)
        self._thread.start()

    def saw_event(self, event: Event, state: State) -> None:
        """Pass on what the leader decides from: lines a rule may match, and exits."""
        if isinstance(event, ChildLine) and self.matcher.candidates(event.text):
            self._report({"kind": "line", "gen": self._gen_of.get(event.gen, -1),
                          "text": event.text})
        elif isinstance(event, ChildExited):
            self._report({"kind": "exit", "gen": self._gen_of.get(event.gen, -1),
                          "returncode": event.returncode})
        elif isinstance(event, GroupRelaunch):
            self._launching = event.group_gen

    def saw_action(self, action: Action, state: State) -> None:
        """Remember which group generation each launch belongs to; pass on a stalled start."""
        if isinstance(action, Spawn):
            self._gen_of[action.gen] = self._launching
        elif isinstance(action, Journal) and action.record.get("event") == STALLED:
            self._report({"kind": "stalled", "gen": self._gen_of.get(state.gen, -1),
                          "stage": action.record.get("stage")})

    def close(self) -> None:
        """Stop the heartbeat."""
        self._stopping.set()
        self._outbox.put(None)
        if self._thread is not None:
            self._thread.join(10)

    # -- inside --------------------------------------------------------------------------

    def _report(self, report: dict[str, Any]) -> None:
        self._outbox.put(report)

    def _beat_loop(self) -> None:
        while not self._stopping.is_set():
            reports = self._drain(self.cfg.heartbeat_s)
            if self._stopping.is_set():
                return
            body = {"rank": self.spec.rank, "gen": self._follower.gen, "reports": reports}
            got = post(self.spec.leader, self.spec.port, "/group/beat", body,
                       timeout=max(2.0, self.cfg.heartbeat_s * 2))
            reply: core.Reply | None = None
            if got is not None and got[0] == 410:
                # The leader dropped this node (silent too long) or is a new leader: join
                # again, and relaunch with whatever generation it runs now.
                got = self._rejoin()
                if got is None:
                    return
            if got is not None and got[0] == 200:
                with contextlib.suppress(ValueError):
                    reply = _reply(got[1])
            elif reports:  # not heard: they go again with the next beat
                for report in reports:
                    self._outbox.put(report)
            self._follower, events = core.follow(self._follower, reply, self._clock(),
                                                 self.options)
            for event in events:
                self._put(event)
            if self._follower.done:
                return

    def _put(self, event: Event) -> None:
        if self._events is not None:
            self._events.put(event)

    def _rejoin(self) -> tuple[int, dict[str, Any]] | None:
        """Join again (None: refused now, the loop ends with the refusal)."""
        body = {"rank": self.spec.rank, "digest": self.digest.to_json()}
        got = post(self.spec.leader, self.spec.port, "/group/join", body,
                   timeout=max(2.0, self.cfg.heartbeat_s * 2))
        if got is not None and got[0] == 409:
            why = "the group leader refused this node: " + "; ".join(got[1].get("refused", []))
            self._put(GroupExit(EXIT_REFUSED, why))
            return None
        if got is not None and got[0] == 200:
            self.log.info("group.rejoined", gen=got[1].get("gen"))
            self._follower = replace(self._follower, gen=-1)  # relaunch at the leader's gen
        return got

    def _drain(self, wait: float) -> list[dict[str, Any]]:
        """What to report: the first item waits up to `wait`, the rest are taken as they are."""
        out: list[dict[str, Any]] = []
        try:
            item = self._outbox.get(timeout=wait)
        except queue.Empty:
            return out
        while item is not None:
            out.append(item)
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                break
        return out


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


# -- wiring (shell/runner.py) ---------------------------------------------------------------


def open_group(spec: core.GroupSpec, cfg: GroupSection, cl: CommandLine, gpu: GpuFacts,
               env: Env, *, state_dir: str) -> tuple[Link, CommandLine, Env, CommandLine | None]:
    """Lead or join: the link, the command line to launch first, the machine's Env, and the
    learned command line the leader replays (None: none)."""
    digest = local_digest(cl, env.sglang_version, gpu)
    if spec.leads:
        learned = Learned(state_dir, digest, cl)
        replayed = learned.replay(env.options)
        link = LeaderLink(spec, cfg, digest, env.derived_dir, learned=learned)
        return link, replayed or cl, replace(env, role="leader"), replayed
    worker = WorkerLink(spec, cfg, digest, options=env.options, matcher=env.matcher,
                        derived_dir=env.derived_dir)
    first = worker.join()
    # A worker's own /health is SGLang's dummy (always 200 on ranks >= 1): never probed.
    env = replace(env, role="worker", health=replace(env.health, enabled=False))
    return worker, first, env, None


def worker_reload(reload: Reload) -> Reload:
    """A worker applies a reloaded rule pack or policy, never a command line of its own."""

    def wrapped(kind: str, path: str | None, env: Env) -> ReloadOutcome:
        outcome = reload(kind, path, env)
        if outcome.cl is None:
            return outcome
        note = "a group worker launches what its leader launches; restart the group to apply it"
        return replace(outcome, cl=None, record={**outcome.record, "note": note})

    return wrapped
