"""The machine's group roles, scripted: the leader decides for every node, a worker follows."""

from __future__ import annotations

from dataclasses import replace

from sglang_guard.common.outcomes import GiveUpCause
from sglang_guard.errors import EXIT_GIVE_UP, EXIT_LEADER_LOST
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.supervise import machine
from sglang_guard.supervise.actions import Exit, Probe, Schedule, Spawn, Stop
from sglang_guard.supervise.events import GroupExit, GroupReady, GroupRelaunch, PeerDown, PeerLine
from support.machinerun import (
    ARGV,
    OPTIONS,
    Run,
    events_of,
    make_env,
    of,
    only,
    record,
)
from support.pack import CRASH_LINE, FA3_LINE


def leader() -> Run:
    run = Run(env=replace(make_env(max_failures=2), role="leader"))
    run.start()
    run.ready()
    return run


def worker() -> Run:
    env = make_env()
    run = Run(env=replace(env, role="worker", health=replace(env.health, enabled=False)))
    run.start()
    return run


def test_a_workers_fatal_line_is_fixed_once_by_the_leader_and_names_the_node() -> None:
    run = leader()
    acts = run.send(PeerLine(run.gen, 2, FA3_LINE))
    rem = record(acts, "remediated")
    assert (rem["rule"], rem["node"], rem["flag"]) == ("fa3-sm", 2, "--attention-backend")
    assert only(acts, Stop).gen == 1
    spawn = only(run.exited(0), Spawn)
    assert "--attention-backend" not in spawn.argv
    # The same crash seen on another node in the old generation is over already.
    assert run.send(PeerLine(1, 1, FA3_LINE)) == []


def test_the_same_rule_on_another_node_is_the_groups_second_fire() -> None:
    run = leader()
    run.send(PeerLine(run.gen, 2, CRASH_LINE))
    run.tick("settle")  # a catch-all waits out the settle window
    run.exited(1)
    run.backoff_then_spawn()
    assert run.state.fired == {"crash": 1}
    run.send(PeerLine(run.gen, 1, CRASH_LINE))
    run.tick("settle")
    assert run.state.fired == {"crash": 2}
    acts = run.exited(1)
    # The crash-loop limit is the group's, kept by the leader.
    assert isinstance(acts[-1], Exit) and acts[-1].code == EXIT_GIVE_UP


def test_a_peer_ready_line_is_not_the_leaders_readiness() -> None:
    run = Run(env=replace(make_env(), role="leader"))
    run.start()
    assert not of(run.send(PeerLine(run.gen, 1, machine.READY_LINE)), Probe)


def test_a_lost_worker_restarts_the_group_as_a_failure() -> None:
    run = leader()
    acts = run.send(PeerDown(run.gen, 2, "node 2's guard has not been heard from for 3s"))
    assert record(acts, "group.node_down")["node"] == 2
    assert only(acts, Stop).reason == "node 2 down"
    acts = run.exited(0)
    assert "backoff" in events_of(acts)
    assert run.state.failures  # counted toward the crash loop
    assert run.send(PeerDown(1, 2, "late")) == []  # an old generation's news


def test_a_worker_decides_nothing_and_holds_after_its_sglang_exits() -> None:
    run = worker()
    assert run.line(FA3_LINE) == []
    acts = run.exited(1)
    assert run.state.phase == "held"
    assert not of(acts, Schedule) and not of(acts, Spawn)
    assert run.tick("ready_timeout") == []


def test_a_worker_relaunches_on_the_leaders_order_and_turns_ready_with_it() -> None:
    run = worker()
    new = parse_command_line((*ARGV[:2], "--port", "31000"), OPTIONS)
    acts = run.send(GroupRelaunch(2, new, {"event": "remediated", "gen": 1}))
    assert record(acts, "group.relaunch")["cause"] == {"event": "remediated", "gen": 1}
    assert only(acts, Stop).reason == "group relaunch"
    assert only(run.exited(0), Spawn).argv == new.argv
    acts = run.send(GroupReady(2))
    assert run.state.phase == "ready" and "ready" in events_of(acts)
    assert not of(acts, Schedule) or all(s.name != "liveness" for s in of(acts, Schedule))


def test_a_held_worker_relaunches_at_once() -> None:
    run = worker()
    run.exited(1)
    acts = run.send(GroupRelaunch(2, run.state.cl, {}))
    assert only(acts, Spawn).gen == 2


def test_a_worker_ends_with_its_group() -> None:
    run = worker()
    acts = run.send(GroupExit(EXIT_LEADER_LOST, "leader lost", GiveUpCause.LEADER_LOST))
    assert only(acts, Stop)
    acts = run.exited(0)
    assert acts[-1] == Exit(EXIT_LEADER_LOST, "leader lost")
