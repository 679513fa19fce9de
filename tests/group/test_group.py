"""Issue 15's acceptance: real guards, one per simulated node, real HTTP between them."""

from __future__ import annotations

import json
import shutil
import signal
import time
from typing import Any

from sglang_guard.errors import EXIT_GIVE_UP, EXIT_LEADER_LOST, EXIT_OK, EXIT_REFUSED
from support.group import OOM_LINE, Group, leader_plan, worker_plan
from support.harness import HealthServer, wait_for
from support.procs import wait_gone

RULE = "oom-lower-mem-fraction"


def without_rank(argv: list[str]) -> list[str]:
    """An argv with its --node-rank value blanked."""
    out = list(argv)
    out[out.index("--node-rank") + 1] = "R"
    return out


def test_a_worker_with_another_config_json_is_refused(group: Any) -> None:
    g: Group = group(2)
    leader = g.start(g.node(0, [leader_plan()]))
    worker = g.node(1, [worker_plan()], config={"architectures": ["MistralForCausalLM"]})
    leader.wait_event("child.start")
    code, err = g.start(worker).finish()
    assert code == EXIT_REFUSED, err
    assert "refused node 1" in err
    assert "config.json" in err
    assert worker.launcher.argvs() == []  # refused before launching anything
    (exit_,) = worker.events("guard.exit")
    assert exit_["code"] == EXIT_REFUSED and "config.json" in exit_["reason"]
    leader.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert leader.finish()[0] == EXIT_OK


def test_fatal_line_on_worker_2_restarts_all_three_with_one_fix(group: Any,
                                                               health: HealthServer) -> None:
    g: Group = group(3)
    go1, go2 = g.tmp / "go1", g.tmp / "go2"
    leader = g.node(0, [leader_plan()])
    w1 = g.node(1, [worker_plan(), worker_plan(["wait_file", str(go1)],
                                               ["print", "stderr", OOM_LINE])])
    w2 = g.node(2, [worker_plan(["wait_file", str(go2)], ["print", "stderr", OOM_LINE]),
                    worker_plan()])
    for node in (leader, w1, w2):
        g.start(node)
    for node in (w1, w2):
        node.wait_event("ready")  # the leader's confirmed readiness, not their own
    go2.touch()
    rem = leader.wait_event("remediated")[0]
    assert (rem["rule"], rem["node"], rem["old_value"], rem["new_value"]) == (RULE, 2, "0.9",
                                                                             "0.81")
    for node in (leader, w1, w2):
        wait_for(lambda n=node: len(n.launcher.argvs()) >= 2, what=f"node {node.rank} relaunch")
    second = [without_rank(n.launcher.argvs()[1]) for n in (leader, w1, w2)]
    assert second[0] == second[1] == second[2]
    assert second[0][second[0].index("--mem-fraction-static") + 1] == "0.81"
    assert [n.launcher.argvs()[1][n.launcher.argvs()[1].index("--node-rank") + 1]
            for n in (leader, w1, w2)] == ["0", "1", "2"]
    assert len(leader.events("remediated")) == 1  # one decision for the three nodes
    for node in (w1, w2):
        relaunch = node.wait_event("group.relaunch")[0]
        assert relaunch["cause"] == {"event": "remediated", "gen": rem["gen"], "rule": RULE,
                                     "flag": "--mem-fraction-static", "node": 2,
                                     "reason": rem["reason"]}
        assert not node.events("remediated")  # the worker decided nothing itself

    # The same rule fires again, on another node: it is the group's second fire (next rung).
    for node in (w1, w2):
        node.wait_event("ready", times=2)
    go1.touch()
    rems = leader.wait_event("remediated", times=2)
    assert (rems[1]["rule"], rems[1]["node"], rems[1]["old_value"], rems[1]["new_value"]) == (
        RULE, 1, "0.81", "0.729")
    for node in (leader, w1, w2):
        wait_for(lambda n=node: len(n.launcher.argvs()) >= 3, what=f"node {node.rank} relaunch")
    assert len({json.dumps(without_rank(n.launcher.argvs()[2])) for n in (leader, w1, w2)}) == 1

    leader.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert leader.finish()[0] == EXIT_OK
    for node in (w1, w2):  # the leader's end is the group's end
        code, err = node.finish()
        assert code == EXIT_OK, err
    assert g.fake_pids() == []
    # Only rank 0's /health was ever probed, once per launch: never a worker's dummy one.
    assert health.hits == {"/health": len(leader.launcher.argvs())}


def test_leader_sigkill_workers_stop_their_trees_and_exit_within_the_bound(group: Any) -> None:
    g: Group = group(3)
    leader = g.node(0, [leader_plan()])
    workers = [g.node(r, [worker_plan(["spawn", 1, False])]) for r in (1, 2)]
    for node in (leader, *workers):
        g.start(node)
    for node in workers:
        node.wait_event("ready")
    kids = {n.rank: g.fake_pids(n) for n in workers}
    assert all(kids.values())
    killed = time.monotonic()
    leader.proc.kill()  # type: ignore[union-attr]
    # The documented bound: leader_lost_s + one heartbeat + one request timeout + stop grace.
    bound = 3.0 + 0.2 + 2.0 + 2.0
    for node in workers:
        code, err = node.finish(timeout=bound + 10)
        assert code == EXIT_LEADER_LOST, err
        assert "leader has not answered" in err
    assert time.monotonic() - killed < bound + 2.0  # + the guard's own start/exit overhead
    for node in workers:
        assert wait_gone(kids[node.rank], timeout=5) == []
        assert node.events("group.exit")[0]["code"] == EXIT_LEADER_LOST


def test_worker_sigkill_the_leader_relaunches_the_group(group: Any) -> None:
    g: Group = group(3)
    leader = g.node(0, [leader_plan()])
    w1 = g.node(1, [worker_plan()])
    w2 = g.node(2, [worker_plan()])
    for node in (leader, w1, w2):
        g.start(node)
    for node in (w1, w2):
        node.wait_event("ready")
    w2.proc.kill()  # type: ignore[union-attr]
    down = leader.wait_event("group.node_down")[0]
    assert down["node"] == 2
    assert "not been heard from" in down["reason"]
    starts = leader.wait_event("child.start", times=2)
    assert starts[1]["gen"] == 2
    w1.wait_event("group.relaunch")
    wait_for(lambda: len(w1.launcher.argvs()) >= 2, what="worker 1 relaunched")
    assert leader.events("backoff")  # a lost node is a failure of the group: it backs off

    # The orchestrator starts node 2 again: it joins the new generation.
    for pid in g.fake_pids(w2):  # what the SIGKILLed guard left (its successor reaps it too)
        psutil_kill(pid)
    g.start(w2)
    w2.wait_event("child.start", times=2)
    wait_for(lambda: len(w2.launcher.argvs()) >= 2, what="worker 2 relaunched")
    assert without_rank(w2.launcher.argvs()[-1]) == without_rank(leader.launcher.argvs()[-1])


def psutil_kill(pid: int) -> None:
    """SIGKILL one process (gone already is fine)."""
    import contextlib  # noqa: PLC0415
    import os  # noqa: PLC0415

    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def test_a_learned_fix_survives_a_group_recreation_on_a_persistent_state_dir(
        group: Any) -> None:
    g: Group = group(2)
    leader = g.node(0, [leader_plan()])
    w1 = g.node(1, [worker_plan(["print", "stderr", OOM_LINE]), worker_plan()])
    for node in (leader, w1):
        g.start(node)
    # Generation 2, with the fix, reached ready (generation 1 may have been fixed before).
    wait_for(lambda: any(r["gen"] == 2 for r in leader.events("ready")), what="gen 2 ready")
    wait_for(lambda: len(w1.launcher.argvs()) >= 2, what="worker 1 relaunched")
    assert (leader.state / "group-learned.json").is_file()
    leader.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert leader.finish()[0] == EXIT_OK
    assert w1.finish()[0] == EXIT_OK

    # The orchestrator recreates the group; the state dirs are persistent volumes.
    for node in (leader, w1):
        g.start(node)
    replayed = leader.wait_event("learned.replayed")[0]
    assert "0.81" in replayed["argv_after"]
    for node in (leader, w1):
        wait_for(lambda n=node: len(n.launcher.argvs()) >= 3, what=f"node {node.rank} launch")
        third = node.launcher.argvs()[2]
        assert third[third.index("--mem-fraction-static") + 1] == "0.81"
    assert len(leader.events("remediated")) == 1  # not learned again
    leader.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert leader.finish()[0] == EXIT_OK
    assert w1.finish()[0] == EXIT_OK

    # Without a persistent state dir the leader starts from the user's command line again.
    shutil.rmtree(leader.state)
    g.start(leader)
    wait_for(lambda: len(leader.launcher.argvs()) >= 4, what="leader launch 4")
    fourth = leader.launcher.argvs()[3]
    assert fourth[fourth.index("--mem-fraction-static") + 1] == "0.9"
    assert not leader.events("learned.replayed")


def test_lws_pattern_in_place_restarts_then_the_whole_group_gives_up_together(
        group: Any) -> None:
    """LeaderWorkerSet: the guards find each other from LWS's env alone (no --dist-init-addr
    here); a worker's SGLang that keeps crashing is restarted in place, group-wide, by the
    guards (no pod exits), until the group's crash-loop limit: then every guard exits 75,
    which is when LWS should recreate the group."""
    g: Group = group(2)
    leader = g.node(0, [leader_plan()])
    w1 = g.node(1, [[["print", "stderr", "worker crashed"], ["exit", 1]]])
    lws = {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "2"}
    for node in (leader, w1):
        g.start(node, env={**lws, "LWS_WORKER_INDEX": str(node.rank)}, dist_init=False)
    code, err = leader.finish()
    assert code == EXIT_GIVE_UP, err
    assert "crash loop: 3 failures" in err
    code, err = w1.finish()
    assert code == EXIT_GIVE_UP, err
    assert len(w1.launcher.argvs()) == 3  # three launches, one guard process: in place
    downs = leader.events("group.node_down")
    assert [d["reason"] for d in downs] == ["SGLang on node 1 exited with status 1"] * 3
    assert len(leader.events("backoff")) == 2
    (exit_,) = w1.events("group.exit")
    assert exit_["reason"].startswith("the group leader exited: crash loop: 3 failures")
