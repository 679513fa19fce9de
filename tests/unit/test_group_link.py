"""group/shell/group.py's two sides, without the network: the leader's handlers, a worker's
reports."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import pytest

from sglang_guard.common.outcomes import GaveUp, GiveUpCause, LogFix, Ready, StartStalled
from sglang_guard.config.guardconfig import GroupSection
from sglang_guard.errors import EXIT_GIVE_UP
from sglang_guard.group import group as core
from sglang_guard.group.shell.groupleader import LeaderLink
from sglang_guard.group.shell.groupwire import reply_of
from sglang_guard.group.shell.groupworker import WorkerLink
from sglang_guard.rules.rules import Matcher, parse_pack
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.releases import load_option_table
from sglang_guard.supervise.actions import Exit, Journal, Spawn, Stop
from sglang_guard.supervise.events import (
    ChildExited,
    ChildLine,
    Event,
    GroupRelaunch,
    PeerDown,
    PeerLine,
)
from sglang_guard.supervise.machine import State

OPTIONS = load_option_table()
ARGV = ("--model-path", "/m", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:20000")
CL = parse_command_line(ARGV, OPTIONS)
DIGEST = core.make_digest(CL, "c" * 64, "0.5.23", 90, 8)
SPEC = core.GroupSpec(nnodes=2, rank=0, leader="127.0.0.1", port=0)
CFG = GroupSection(heartbeat_s=60.0)  # the watch thread never wakes during a test


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def leader() -> Iterator[tuple[LeaderLink, queue.Queue[Event]]]:
    link = LeaderLink(SPEC, CFG, DIGEST, "/state/derived", clock=Clock())
    events: queue.Queue[Event] = queue.Queue()
    link._events = events  # the handlers' queue, without starting the server threads
    yield link, events
    link.httpd.server_close()


def test_join_refuses_other_inputs_and_admits_equal_ones(
        leader: tuple[LeaderLink, queue.Queue[Event]]) -> None:
    link, _ = leader
    other = core.make_digest(CL, "d" * 64, "0.5.23", 90, 8)
    status, body = link.join({"rank": 1, "digest": other.to_json()})
    assert status == 409
    assert body["refused"] == ["the model's config.json (sha256): dddddddddddd here, "
                               "cccccccccccc on the leader"]
    link.saw_action(Spawn(1, CL.argv), State(cl=CL))
    status, body = link.join({"rank": 1, "digest": DIGEST.to_json()})
    assert status == 200
    assert (body["gen"], body["launch"]["argv"]) == (1, list(CL.argv))


def test_beat_passes_on_current_reports_only(
        leader: tuple[LeaderLink, queue.Queue[Event]]) -> None:
    link, events = leader
    assert link.beat({"rank": 1, "gen": 1})[0] == 410  # never joined
    link.saw_action(Spawn(1, CL.argv), State(cl=CL))
    link.join({"rank": 1, "digest": DIGEST.to_json()})
    fix = LogFix(rule="r", line="boom", gen=1, flag="--x", action="drop_flag", old_value="1",
                 new_value=None, reason="why", argv_before=[], argv_after=[], node=1)
    link.saw_action(Journal(fix), State(cl=CL))
    link.saw_action(Spawn(2, CL.argv), State(cl=CL, gen=2))
    status, body = link.beat({"rank": 1, "gen": 1, "reports": [
        {"kind": "line", "gen": 1, "text": "old news"},
        {"kind": "line", "gen": 2, "text": "fatal"},
        {"kind": "stalled", "gen": 2, "stage": "weight loading"},
        {"kind": "exit", "gen": 2, "returncode": 1},  # the same generation: once is enough
    ]})
    assert status == 200
    assert body["cause"] == {"event": "remediated", "gen": 1, "rule": "r", "flag": "--x",
                             "node": 1, "reason": "why"}
    got = [events.get_nowait() for _ in range(events.qsize())]
    assert got == [PeerLine(2, 1, "fatal"),
                   PeerDown(2, 1, "node 1 stalled in weight loading", "weight loading")]


def test_the_leaders_give_up_cause_goes_to_its_workers(
        leader: tuple[LeaderLink, queue.Queue[Event]]) -> None:
    link, _ = leader
    link.saw_action(Spawn(1, CL.argv), State(cl=CL))
    link.join({"rank": 1, "digest": DIGEST.to_json()})
    link.record(GaveUp(reason="crash loop: 3 failures", cause=GiveUpCause.CRASH_LOOP))
    link.saw_action(Exit(EXIT_GIVE_UP, "crash loop: 3 failures"), State(cl=CL))
    answer = reply_of(link.beat({"rank": 1, "gen": 1})[1])
    assert answer.exit == (EXIT_GIVE_UP, "crash loop: 3 failures")
    assert answer.exit_cause is GiveUpCause.CRASH_LOOP  # not `other`, whatever the wording


def test_ready_is_withdrawn_when_the_leader_stops(
        leader: tuple[LeaderLink, queue.Queue[Event]]) -> None:
    link, _ = leader
    link.saw_action(Spawn(1, CL.argv), State(cl=CL))
    link.join({"rank": 1, "digest": DIGEST.to_json()})
    link.saw_action(Journal(Ready(gen=1, argv=list(CL.argv))), State(cl=CL))
    assert link.beat({"rank": 1, "gen": 1})[1]["ready"] is True
    link.saw_action(Stop(1, "rule r"), State(cl=CL))
    assert link.beat({"rank": 1, "gen": 1})[1]["ready"] is False


def test_a_worker_reports_matching_lines_exits_and_a_stalled_start() -> None:
    pack = parse_pack('[pack]\nname = "t"\nsglang_versions = ">=0.5"\n[[rules]]\nid = "oom"\n'
                      'pattern = "out of memory"\naction = "restart"\n', "t.toml")
    link = WorkerLink(core.GroupSpec(2, 1, "127.0.0.1", 1), CFG, DIGEST, options=OPTIONS,
                      matcher=Matcher([pack]), derived_dir="/w/derived")
    state = State(cl=CL, gen=1)
    link.saw_event(GroupRelaunch(3, CL, {}), state)
    link.saw_action(Spawn(1, CL.argv), state)
    link.saw_event(ChildLine(1, "stderr", "all fine", 8), state)
    oom = "torch.OutOfMemoryError: CUDA out of memory"  # as SGLang's log prints it
    link.saw_event(ChildLine(1, "stderr", oom, len(oom)), state)
    link.saw_action(Journal(StartStalled(gen=1, stage="cuda graph", line="", silent_s=9.0,
                                         limit_s=5.0, action="restart")), state)
    link.saw_event(ChildExited(1, 42, -9), state)
    assert link._drain(0.0) == [
        {"kind": "line", "gen": 3, "text": oom},
        {"kind": "stalled", "gen": 3, "stage": "cuda graph"},
        {"kind": "exit", "gen": 3, "returncode": -9},
    ]
