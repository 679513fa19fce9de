"""group/group.py on a fake clock: the group's spec, digests, the leader's roster, a follower."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sglang_guard.common.outcomes import GiveUpCause
from sglang_guard.errors import EXIT_GIVE_UP, EXIT_LEADER_LOST, InputError
from sglang_guard.group import group
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.releases import load_option_table
from sglang_guard.supervise.events import GroupExit, GroupReady, GroupRelaunch

OPTIONS = load_option_table()
BASE = ("--model-path", "/m", "--tp", "16", "--nnodes", "3", "--dist-init-addr",
        "10.0.0.5:20000", "--api-key", "sekrit")


def cl(*argv: str):  # type: ignore[no-untyped-def]
    return parse_command_line(argv, OPTIONS)


def digest(*argv: str, config: str | None = "c" * 64, sm: int | None = 90):  # type: ignore[no-untyped-def]
    return group.make_digest(cl(*argv), config, "0.5.23", sm, 8)


# --- who is where --------------------------------------------------------------------------


def test_single_node_is_no_group() -> None:
    assert group.group_spec(cl("--model-path", "/m"), {}, 9489) is None
    assert group.group_spec(cl("--model-path", "/m", "--nnodes", "1"), {}, 9489) is None


def test_spec_from_sglang_flags() -> None:
    spec = group.group_spec(cl(*BASE, "--node-rank", "2"), {}, 9489)
    assert spec == group.GroupSpec(nnodes=3, rank=2, leader="10.0.0.5", port=9489)
    assert not spec.leads
    assert group.group_spec(cl(*BASE), {}, 9489).leads  # type: ignore[union-attr]


def test_the_default_group_port_moves_with_the_dist_init_port() -> None:
    spec = group.group_spec(cl(*BASE), {}, 0)  # 10.0.0.5:20000
    assert spec is not None and spec.port == 9489
    other = cl("--model-path", "/m", "--nnodes", "2", "--dist-init-addr", "[fd00::5]:20007")
    assert group.group_spec(other, {}, 0).port == 9489 + 14  # type: ignore[union-attr]
    lws = {"LWS_LEADER_ADDRESS": "l.ns", "LWS_GROUP_SIZE": "2"}
    assert group.group_spec(cl("--model-path", "/m"), lws, 0).port == 9489  # type: ignore[union-attr]
    assert group.group_spec(cl(*BASE), {}, 7000).port == 7000  # type: ignore[union-attr]


def test_spec_from_lws_env_and_ipv6_dist_init() -> None:
    env = {"LWS_LEADER_ADDRESS": "sglang-0.sglang.ns", "LWS_WORKER_INDEX": "1",
           "LWS_GROUP_SIZE": "2"}
    spec = group.group_spec(cl("--model-path", "/m"), env, 7000)
    assert spec == group.GroupSpec(2, 1, "sglang-0.sglang.ns", 7000)
    v6 = cl("--model-path", "/m", "--nnodes", "2", "--dist-init-addr", "[fd00::5]:20000")
    assert group.group_spec(v6, {}, 1).leader == "fd00::5"  # type: ignore[union-attr]


def test_flags_and_lws_env_that_disagree_are_an_error() -> None:
    with pytest.raises(InputError, match="--node-rank 1 but LWS_WORKER_INDEX=2"):
        group.group_spec(cl(*BASE, "--node-rank", "1"), {"LWS_WORKER_INDEX": "2"}, 1)
    with pytest.raises(InputError, match="outside the group"):
        group.group_spec(cl(*BASE, "--node-rank", "3"), {}, 1)
    with pytest.raises(InputError, match="needs --dist-init-addr"):
        group.group_spec(cl("--model-path", "/m", "--nnodes", "2"), {}, 1)


# --- the same inputs everywhere ------------------------------------------------------------


def test_digest_leaves_out_the_rank_and_the_http_server_and_hides_secrets() -> None:
    a = digest(*BASE, "--node-rank", "0", "--host", "10.1.2.3", "--port", "30000")
    b = digest(*BASE, "--node-rank", "2")
    assert group.differences(a, b) == []
    assert "sekrit" not in str(a.to_json())
    assert group.Digest.from_json(a.to_json()) == a


def test_differences_name_what_differs() -> None:
    leader = digest(*BASE)
    node = digest(*BASE, "--attention-backend", "fa3", config="d" * 64, sm=80)
    assert group.differences(leader, node) == [
        "--attention-backend: fa3 here, <absent> on the leader",
        "the model's config.json (sha256): dddddddddddd here, cccccccccccc on the leader",
        "the GPU SM: 80 here, 90 on the leader",
    ]
    other_key = digest(*BASE[:-1], "other")
    assert group.differences(leader, other_key) == [
        "--api-key: differs from the leader's (a secret: no value is shown)"]
    packs = group.make_digest(cl(*BASE), "c" * 64, "0.5.23", 90, 8, rules="a" * 64)
    assert group.differences(leader, packs) == [
        "the rule packs (sha256): aaaaaaaaaaaa here, unset on the leader"]
    policy = group.make_digest(cl(*BASE), "c" * 64, "0.5.23", 90, 8, policy="b" * 64)
    assert group.differences(leader, policy)[0].startswith("the guard policy (sha256)")


def test_secret_hashes_are_keyed_with_the_group_secret() -> None:
    plain = digest(*BASE).flags["--api-key"]
    keyed = group.make_digest(cl(*BASE), None, None, None, None, key=b"k" * 16)
    other = group.make_digest(cl(*BASE), None, None, None, None, key=b"j" * 16)
    assert plain is not None and plain.startswith("sha256:")
    assert keyed.flags["--api-key"] != other.flags["--api-key"]
    assert str(keyed.flags["--api-key"]).startswith("hmac:")
    assert "sekrit" not in str(keyed.to_json())


@pytest.mark.parametrize("argv", [
    ("--api-key", "sekrit"), ("--api-key=sekrit",), ("--api-k", "sekrit"),
    ("--admin-api-key", "sekrit", "--api-key=sekrit2"),
])
def test_a_launch_travels_with_its_secrets_masked_and_a_worker_fills_its_own(
        argv: tuple[str, ...]) -> None:
    mine = cl("--model-path", "/m", "--nnodes", "2", "--node-rank", "0", *argv)
    launch = group.masked_launch(mine, "/d")
    assert not any("sekrit" in tok for tok in launch.argv)
    assert "***" in " ".join(launch.argv)
    worker_own = cl("--model-path", "/m", "--nnodes", "2", "--node-rank", "1", *argv)
    worker = group.worker_command_line(launch, 1, OPTIONS, "/w", worker_own)
    assert worker.value("api_key") == mine.value("api_key")
    assert worker.value("admin_api_key") == mine.value("admin_api_key")
    assert worker.value("node_rank") == "1"
    assert group.unmask(launch, OPTIONS, mine).argv == mine.argv


def test_a_masked_yaml_secret_is_filled_from_the_workers_own() -> None:
    yaml_data = {"api-key": "sekrit", "tp-size": 2}
    mine = parse_command_line(("--config", "/c.yaml", "--nnodes", "2"), OPTIONS, yaml_data)
    launch = group.masked_launch(mine, "/d")
    assert launch.yaml_data == {"api-key": "***", "tp-size": 2}
    back = group.unmask(launch, OPTIONS, mine)
    assert back.value("api_key") == "sekrit"
    with pytest.raises(ValueError, match="no value"):
        group.unmask(launch, OPTIONS, cl("--nnodes", "2"))


# --- the leader's roster on a fake clock ----------------------------------------------------


def roster(nnodes: int = 3) -> group.Roster:
    return group.launched(group.Roster(nnodes, digest(*BASE)), 1, now=100.0)


def test_join_admits_equal_inputs_and_refuses_the_rest() -> None:
    r, problems = group.join(roster(), 1, digest(*BASE), now=101.0)
    assert problems == []
    assert r.members[1].gen == 0
    _, problems = group.join(r, 2, digest(*BASE, config=None), now=101.0)
    assert problems == ["the model's config.json (sha256): unset here, cccccccccccc on the leader"]
    _, problems = group.join(r, 3, digest(*BASE), now=101.0)
    assert "not a worker rank" in problems[0]


def test_overdue_reports_a_silent_worker_once_and_drops_it() -> None:
    r, _ = group.join(roster(), 1, digest(*BASE), now=101.0)
    r, _ = group.join(r, 2, digest(*BASE), now=101.0)
    r = group.beat(r, 1, 1, "starting", now=102.0)
    r = group.beat(r, 2, 1, "starting", now=102.0)
    r, down = group.overdue(r, now=104.0, lost_s=3.0, join_s=60.0)
    assert down == []
    r = group.beat(r, 1, 1, "ready", now=105.5)
    r, down = group.overdue(r, now=105.5, lost_s=3.0, join_s=60.0)
    assert down == [(2, "node 2's guard has not been heard from for 3s", None)]
    assert set(r.members) == {1}  # node 2 must join again
    r, down = group.overdue(r, now=106.0, lost_s=3.0, join_s=60.0)
    assert down == []  # once per generation
    r = group.launched(r, 2, now=107.0)
    r = group.beat(r, 1, 2, "starting", now=107.0)
    r, down = group.overdue(r, now=107.5, lost_s=3.0, join_s=60.0)
    assert down == []  # generation 2 gives node 2 its join timeout again


def test_a_worker_that_never_comes_up_is_reported_after_the_join_timeout() -> None:
    r = roster(2)
    r, down = group.overdue(r, now=159.0, lost_s=3.0, join_s=60.0)
    assert down == []
    r, down = group.overdue(r, now=161.0, lost_s=3.0, join_s=60.0)
    assert down == [(1, "node 1 did not come up in generation 1 within 60s "
                        "(group.join_timeout_s)", "distributed init")]


def test_no_reports_after_the_leader_ended() -> None:
    r = replace(roster(2), exit=(EXIT_GIVE_UP, "crash loop"))
    assert group.overdue(r, now=1e6, lost_s=3.0, join_s=60.0)[1] == []


# --- a worker following -------------------------------------------------------------------


LAUNCH = group.Launch((*BASE, "--node-rank", "0", "--mem-fraction-static", "0.81"), None,
                      "/state/derived")


def follower(now: float = 0.0) -> group.Follower:
    return group.Follower(rank=2, gen=1, last_ok=now, lost_s=5.0, derived_dir="/w/derived")


def reply(gen: int = 1, *, ready: bool = False, exit_: tuple[int, str] | None = None
          ) -> group.Reply:
    return group.Reply(gen, LAUNCH, ready, exit_, {"event": "remediated", "gen": 1})


def test_a_new_generation_relaunches_with_the_leaders_argv_and_this_rank() -> None:
    f, events = group.follow(follower(), reply(2), 1.0, OPTIONS)
    (relaunch,) = events
    assert isinstance(relaunch, GroupRelaunch)
    assert relaunch.group_gen == 2 and f.gen == 2
    assert relaunch.cl.value("node_rank") == "2"
    assert relaunch.cl.value("mem_fraction_static") == "0.81"
    assert relaunch.cause == {"event": "remediated", "gen": 1}
    assert group.follow(f, reply(2), 2.0, OPTIONS)[1] == []  # once


def test_ready_follows_the_leaders_confirmed_state() -> None:
    assert group.follow(follower(), reply(1), 1.0, OPTIONS)[1] == []
    assert group.follow(follower(), reply(1, ready=True), 1.0, OPTIONS)[1] == [GroupReady(1)]


def test_leader_silence_past_the_bound_ends_the_worker_with_76() -> None:
    f, events = group.follow(follower(now=10.0), None, 15.0, OPTIONS)
    assert events == []
    f, events = group.follow(f, None, 15.1, OPTIONS)
    assert events == [GroupExit(EXIT_LEADER_LOST, "the group leader has not answered for 5s "
                                                  "(group.leader_lost_s)", GiveUpCause.LEADER_LOST)]
    assert f.done and group.follow(f, None, 99.0, OPTIONS)[1] == []


def test_the_leaders_end_is_the_workers_end() -> None:
    _, events = group.follow(follower(), reply(exit_=(EXIT_GIVE_UP, "crash loop")), 1.0, OPTIONS)
    assert events == [GroupExit(EXIT_GIVE_UP, "the group leader exited: crash loop",
                                GiveUpCause.OTHER)]  # a leader that did not send its cause
    cause = replace(reply(exit_=(EXIT_GIVE_UP, "crash loop")), exit_cause=GiveUpCause.CRASH_LOOP)
    _, events = group.follow(follower(), cause, 1.0, OPTIONS)
    assert events == [GroupExit(EXIT_GIVE_UP, "the group leader exited: crash loop",
                                GiveUpCause.CRASH_LOOP)]  # the worker gives up for its cause


def test_a_derived_yaml_is_named_in_the_workers_own_state_dir() -> None:
    yaml_data = {"mem_fraction_static": 0.81, "node_rank": 0}
    launch = group.Launch(("--config", "/leader/derived/sglang-config-abc.yaml", *BASE),
                          yaml_data, "/leader/derived")
    worker = group.worker_command_line(launch, 1, OPTIONS, "/w/derived")
    assert worker.config_path is not None
    assert worker.config_path.startswith("/w/derived/sglang-config-")
    assert worker.value("node_rank") == "1"  # the rank the YAML gave is overridden
    assert worker.yaml_data == yaml_data  # written under /w/derived at spawn


def test_the_lws_manifest_wires_the_group_port() -> None:
    """deploy/kubernetes/leaderworkerset.yaml: the leader's guard binds the group port beyond
    loopback and declares it; both pods read that guard config."""
    from pathlib import Path  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    from sglang_guard.config.guardconfig import DEFAULT_GROUP_PORT, parse_guard_config  # noqa: PLC0415

    path = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "leaderworkerset.yaml"
    docs = {d["kind"]: d for d in yaml.safe_load_all(path.read_text())}
    cfg = parse_guard_config(docs["ConfigMap"]["data"]["guard.toml"], "configmap").group
    assert cfg.port == DEFAULT_GROUP_PORT and not cfg.bind.startswith("127.")
    lwt = docs["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    (leader,) = lwt["leaderTemplate"]["spec"]["containers"]
    assert {"name": "group", "containerPort": DEFAULT_GROUP_PORT} in leader["ports"]
    for spec in (lwt["leaderTemplate"]["spec"], lwt["workerTemplate"]["spec"]):
        (container,) = spec["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert env["SGLANG_GUARD_CONFIG"].rsplit("/", 1)[0] in mounts
