"""A worker's side of a group: join the leader, report, follow its answers on a heartbeat."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import replace
from typing import Any

from sglang_guard.common.outcomes import GiveUpCause, StartStalled
from sglang_guard.common.shell.logsetup import get_logger
from sglang_guard.config.guardconfig import GroupSection
from sglang_guard.errors import EXIT_REFUSED, GuardError, LeaderLost, Refused
from sglang_guard.group import group as core
from sglang_guard.group.shell.groupwire import UNPROVEN, Clock, post, reply_of
from sglang_guard.rules.rules import Matcher
from sglang_guard.sglang.argv import CommandLine
from sglang_guard.sglang.options import OptionTable
from sglang_guard.supervise.actions import Action, Journal, Spawn
from sglang_guard.supervise.events import ChildExited, ChildLine, Event, GroupExit, GroupRelaunch
from sglang_guard.supervise.machine import State
from sglang_guard.supervise.shell.observer import Quiet


class WorkerLink(Quiet):
    """A worker's guard: joins its leader, reports its lines and exits, follows the answers."""

    def __init__(self, spec: core.GroupSpec, cfg: GroupSection, digest: core.Digest, *,
                 options: OptionTable, matcher: Matcher, derived_dir: str,
                 clock: Clock = time.monotonic, secret: bytes | None = None,
                 own: CommandLine | None = None) -> None:
        self.spec = spec
        self.secret = secret
        self.own = own  # this node's command line: its secrets fill the leader's masked ones
        self._unproven: str | None = None  # why the last answer was not the leader's
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
            got = self._post("/group/join", body)
            if got is not None and got[0] == 409:
                raise Refused(f"the group leader at {self.spec.leader}:{self.spec.port} refused "
                              f"node {self.spec.rank}: " + "; ".join(got[1].get("refused", [])))
            if got is not None and got[0] == 200:
                heard = True
                reply = reply_of(got[1])
                if reply.launch is not None and reply.exit is None:
                    self._follower = core.Follower(self.spec.rank, reply.gen, self._clock(),
                                                   self.cfg.leader_lost_s, self.derived_dir)
                    self._launching = reply.gen
                    self.log.info("group.joined", leader=self.spec.leader, gen=reply.gen)
                    try:
                        return core.worker_command_line(reply.launch, self.spec.rank,
                                                        self.options, self.derived_dir,
                                                        self.own)
                    except ValueError as exc:
                        raise Refused(f"the group leader's launch cannot run here: {exc}"
                                      ) from None
            if self._clock() > deadline:
                what = "has not launched" if heard else (
                    f"gave no answer that proves the group secret ({self._unproven})"
                    if self._unproven else "did not answer")
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
        if isinstance(event, ChildLine) and self.matcher.candidates(event.text,
                                                                    event.ends_traceback):
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
        elif isinstance(action, Journal) and isinstance(action.record, StartStalled):
            # the start-hang watcher's event (issue 12): passed to the leader
            self._report({"kind": "stalled", "gen": self._gen_of.get(state.gen, -1),
                          "stage": action.record.stage})

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
            got = self._post("/group/beat", body)
            reply: core.Reply | None = None
            if got is not None and got[0] == 410:
                # The leader dropped this node (silent too long) or is a new leader: join
                # again, and relaunch with whatever generation it runs now.
                got = self._rejoin()
                if got is None:
                    return
            if got is not None and got[0] == 200:
                with contextlib.suppress(ValueError):
                    reply = reply_of(got[1])
            elif reports:  # not heard: they go again with the next beat
                for report in reports:
                    self._outbox.put(report)
            try:
                self._follower, events = core.follow(self._follower, reply, self._clock(),
                                                     self.options, self.own)
            except (ValueError, GuardError) as exc:  # a launch that cannot run here
                self._put(GroupExit(EXIT_REFUSED, f"the group leader's launch cannot run "
                                                  f"here: {exc}", GiveUpCause.REFUSED))
                return
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
        got = self._post("/group/join", body)
        if got is not None and got[0] == 409:
            why = "the group leader refused this node: " + "; ".join(got[1].get("refused", []))
            self._put(GroupExit(EXIT_REFUSED, why, GiveUpCause.REFUSED))
            return None
        if got is not None and got[0] == 200:
            self.log.info("group.rejoined", gen=got[1].get("gen"))
            self._follower = replace(self._follower, gen=-1)  # relaunch at the leader's gen
        return got

    def _post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        """One POST to the leader; an answer that does not prove the secret counts as none."""
        got = post(self.spec.leader, self.spec.port, path, body,
                   timeout=max(2.0, self.cfg.heartbeat_s * 2), secret=self.secret)
        if got is not None and got[0] == UNPROVEN:
            why = f"{got[1].get('reason')} (HTTP {got[1].get('status')})"
            if why != self._unproven:
                self.log.warning("group.unproven", leader=self.spec.leader, port=self.spec.port,
                                 reason=why)
            self._unproven = why
            return None
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
