"""The status snapshot folded from journal records: causes, labels, phases, masking."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from sglang_guard.common.outcomes import StopCause
from sglang_guard.config.guardconfig import (
    DEFAULT_STATUS_PORT,
    StatusSection,
    parse_guard_config,
    parse_listen,
)
from sglang_guard.errors import ConfigError
from sglang_guard.status import status as model
from support.records import typed


def fold(records: Iterable[Mapping[str, Any] | tuple[str, str]], snap: model.Snapshot | None = None
         ) -> tuple[model.Snapshot, list[model.Counts]]:
    """Fold records (a ("stop", reason) tuple stands for a machine Stop); time ticks by 1 s."""
    snap = snap or model.Snapshot()
    counts = []
    for t, item in enumerate(records):
        if isinstance(item, tuple):
            snap = model.on_stop(snap, STOP_CAUSES.get(item[1]))
            continue
        snap, c = model.on_record(snap, typed(item), float(t), 1000.0 + t)
        counts.append(c)
    return snap, counts


# What the machine's Stop carries for each of its stop reasons (supervise/machine.py `_stop`).
STOP_CAUSES = {"liveness": StopCause.LIVENESS, "ready timeout": StopCause.READY_TIMEOUT,
               "config changed": StopCause.RELOAD}


def start(gen: int) -> dict[str, Any]:
    return {"event": "child.start", "gen": gen, "reason": "x", "argv": ["--model-path", "/m"]}


EXIT = {"event": "child.exit", "gen": 1, "pid": 1, "returncode": 1}


def test_the_first_launch_is_start_and_a_crash_restart_is_crash() -> None:
    snap, counts = fold([start(1), EXIT, {"event": "backoff", "delay_s": 2.5}, start(2)])
    assert [(c.launch, c.restart) for c in counts if c.launch] == [("start", None),
                                                                  ("crash", "crash")]
    assert snap.generation == 2 and snap.child_up and snap.cause is None


@pytest.mark.parametrize(("before_exit", "cause"), [
    ([("stop", "liveness")], "liveness"),
    ([("stop", "ready timeout")], "ready_timeout"),
    ([("stop", "config changed")], "reload"),
    ([{"event": "remediated", "trigger": "log", "rule": "fa3-sm", "flag": "--attention-backend",
       "action": "drop_flag"}, ("stop", "rule fa3-sm")], "fix"),
    ([{"event": "restored", "rule": "fa3-sm"}, ("stop", "repeat fa3-sm")], "fix"),
    ([{"event": "crash.detected", "rule": "crash"}, ("stop", "rule crash")], "crash"),
])
def test_the_restart_cause_comes_from_what_ended_the_launch(
        before_exit: list[Any], cause: str) -> None:
    _, counts = fold([start(1), *before_exit, EXIT, start(2)])
    assert counts[-1].restart == cause
    assert counts[-1].launch == cause


def test_a_remediation_is_counted_with_its_labels_and_kept_for_status() -> None:
    rec = {"event": "remediated", "trigger": "log", "rule": "fa3-sm", "flag": "--attention-backend",
           "action": "drop_flag", "old_value": "fa3", "line": "token=abc secret line",
           "argv_before": ["--api-key", "***"], "reason": "needs token=hunter2"}
    snap, counts = fold([start(1), rec])
    assert counts[-1].remediation == ("log", "fa3-sm", "--attention-backend", "drop_flag")
    doc = model.public(snap, 5.0, "0.5.23")
    assert doc["last_remediation"]["rule"] == "fa3-sm"
    assert "line" not in doc["last_remediation"]  # the raw line may quote anything
    assert "hunter2" not in str(doc)
    assert doc["sglang_version"] == "0.5.23"


def test_a_preflight_remediation_does_not_name_the_next_restart() -> None:
    rec = {"event": "remediated", "trigger": "preflight", "rule": "compat.arch",
           "flag": "--attention-backend", "action": "drop"}
    _, counts = fold([rec, start(1)])
    # one action vocabulary: preflight's `drop` is counted as a rule's `drop_flag`
    assert counts[0].remediation == ("preflight", "compat.arch", "--attention-backend",
                                     "drop_flag")
    assert counts[1].launch == "start"


def test_time_to_ready_is_from_the_launch_and_ready_sets_the_gauge() -> None:
    snap, counts = fold([start(1), {"event": "stable", "gen": 0}, {"event": "stable", "gen": 0},
                         {"event": "ready", "gen": 1}])
    assert counts[-1].time_to_ready == 3.0
    assert snap.ready


# The label is the cause the give-up record names (tests/unit/test_outcomes.py: from where
# the machine and the shell give up, whatever the message says).
@pytest.mark.parametrize(("records", "label"), [
    ([{"event": "give_up", "reason": "crash loop: 5 failures within 600s (last: x)",
       "cause": "crash_loop"}], "crash_loop"),
    ([{"event": "give_up", "reason": "fa3 fired again after its fix was applied, and no",
       "cause": "fix_not_held"}], "fix_not_held"),
    ([{"event": "give_up.planned", "rule": "port-busy", "reason": "taken"},
      {"event": "give_up", "reason": "port-busy: taken", "cause": "rule"}], "rule"),
    ([{"event": "give_up", "reason": "port 30000 on 127.0.0.1 is in use by another process",
       "cause": "port_busy"}], "port_busy"),
    ([{"event": "give_up", "reason": "something new"}], "other"),
])
def test_give_up_reasons_become_a_small_label_set(records: list[Any], label: str) -> None:
    snap, counts = fold(records)
    assert counts[-1].give_up == label
    assert label in model.GIVE_UP_REASONS
    assert not model.startup_ok(snap)


def test_startup_is_503_until_ready_then_ok_until_a_stall_or_give_up() -> None:
    snap = model.on_phase(model.Snapshot(), "starting", 1.0)
    assert snap.phase == "starting" and not model.startup_ok(snap)  # not up yet
    up, _ = fold([start(1), {"event": "ready"}], snap)
    assert model.startup_ok(up)
    again, _ = fold([EXIT, start(2)], up)
    assert model.startup_ok(again)  # came up once: a restart is the liveness probe's business
    assert not model.startup_ok(model.on_stalled(again, "weight loading"))


def test_loading_names_the_stage_and_a_stall_is_503() -> None:
    snap = model.on_phase(model.Snapshot(), "starting", 1.0)
    snap = model.on_stage(snap, "weight loading", 2.0)
    assert snap.phase == "loading" and snap.since == 2.0
    assert model.on_phase(snap, "starting", 3.0) is snap  # still loading
    snap = model.on_stalled(snap, "weight loading")
    assert not model.startup_ok(snap)
    assert snap.cause == "stalled"
    assert model.public(snap, 4.0, None)["stalled_stage"] == "weight loading"


def test_machine_phases_map_to_status_phases() -> None:
    assert model.phase_of("idle", None) == "preflight"
    assert model.phase_of("done", None) == "stopped"
    assert {model.phase_of(p, None) for p in ("starting", "ready", "backoff", "stopping")} <= set(
        model.PHASES)
    snap = model.on_phase(model.Snapshot(), "ready", 1.0)
    assert snap.ready
    assert not model.on_phase(snap, "stopping", 2.0).ready


def test_backoff_deadline_is_wall_clock_and_cleared_by_the_next_launch() -> None:
    snap, _ = fold([start(1), EXIT, {"event": "backoff", "delay_s": 4.0}])
    snap = model.on_phase(snap, "backoff", 3.0)
    assert snap.backoff_until == 1002.0 + 4.0
    snap, _ = fold([start(2)], snap)
    assert snap.backoff_until is None


# --- [status] in the guard config ----------------------------------------------------------------


def test_status_defaults_to_loopback_on_the_documented_port() -> None:
    cfg = parse_guard_config("", "g.toml")
    assert cfg.status.address() == ("127.0.0.1", DEFAULT_STATUS_PORT)
    assert StatusSection(listen="off").address() is None


def test_binding_beyond_loopback_needs_allow_remote() -> None:
    with pytest.raises(ConfigError, match=r"status\.listen.*allow_remote"):
        parse_guard_config('[status]\nlisten = "0.0.0.0:9488"\n', "g.toml")
    cfg = parse_guard_config('[status]\nlisten = "0.0.0.0:9488"\nallow_remote = true\n', "g.toml")
    assert cfg.status.address() == ("0.0.0.0", 9488)  # noqa: S104 - what the test asks for


@pytest.mark.parametrize("text", ["9488", "host:", "a:b", "127.0.0.1:70000", "[::1]9488"])
def test_bad_listen_values_are_errors(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(text, allow_remote=True)


def test_ipv6_loopback_and_off() -> None:
    assert parse_listen("[::1]:9488", allow_remote=False) == ("::1", 9488)
    assert parse_listen("off", allow_remote=False) is None
    with pytest.raises(ConfigError, match=r"status\.listen"):
        parse_guard_config("[status]\nlisten = 9488\n", "g.toml")


def test_the_example_config_and_the_systemd_env_document_the_status_port() -> None:
    from pathlib import Path  # noqa: PLC0415

    from sglang_guard.status.shell.status import ENV_ALLOW_REMOTE, ENV_LISTEN  # noqa: PLC0415

    root = Path(__file__).resolve().parents[2]
    example = parse_guard_config((root / "configs/guard.example.toml").read_text(), "example")
    assert example.status == StatusSection()  # every key, with its default
    env = (root / "systemd/sglang-guard.env.example").read_text()
    assert f"{ENV_LISTEN}={StatusSection().listen}" in env
    assert ENV_ALLOW_REMOTE in env


def test_stage_records_from_a_start_hang_watcher_need_no_wiring() -> None:
    snap = model.on_phase(model.Snapshot(), "starting", 0.0)
    snap, _ = fold([start(1), {"event": "start.stage", "stage": "weight loading"}], snap)
    snap = model.on_phase(snap, "starting", 5.0)
    assert (snap.phase, snap.stage) == ("loading", "weight loading")
    snap, counts = fold([{"event": "start.stalled", "stage": "weight loading", "line": "x"},
                         EXIT, start(2)], snap)
    assert counts[-1].restart == "stalled"
    snap, counts = fold([{"event": "start.stalled", "stage": "distributed init"},
                         {"event": "give_up", "reason": "start stalled in distributed init",
                          "cause": "stalled"}])
    assert counts[-1].give_up == "stalled"
    assert not model.startup_ok(snap)


def test_the_environment_overrides_listen_and_is_validated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang_guard.errors import InputError  # noqa: PLC0415
    from sglang_guard.status.shell.status import ENV_ALLOW_REMOTE, ENV_LISTEN, address  # noqa: PLC0415

    monkeypatch.setenv(ENV_LISTEN, "127.0.0.1:9500")
    assert address(StatusSection()) == ("127.0.0.1", 9500)
    monkeypatch.setenv(ENV_LISTEN, "off")
    assert address(StatusSection()) is None
    monkeypatch.setenv(ENV_LISTEN, "0.0.0.0:9488")
    with pytest.raises(InputError, match=ENV_LISTEN):
        address(StatusSection())
    monkeypatch.setenv(ENV_ALLOW_REMOTE, "1")
    assert address(StatusSection()) == ("0.0.0.0", 9488)  # noqa: S104 - what the test asks for


def test_fleet_records_count_and_status_names_the_fleet_fix_in_use() -> None:
    origin = {"guard": "node-1:abcd", "learned_at": "2026-12-01T20:00:00+00:00",
              "confirmations": 2}
    fix = {"event": "remediated", "trigger": "fleet", "rule": "fleet", "key": "k" * 64,
           "flag": "--attention-backend", "action": "drop_flag", "old_value": "fa3",
           "new_value": None, "origin": origin}
    snap, counts = fold([{"event": "fleet.lookup", "result": "hit"}, fix, start(1),
                         {"event": "ready", "gen": 1}, {"event": "fleet.confirmed"}])
    assert [c.fleet for c in counts if c.fleet] == [("lookup", "hit"), ("confirm",)]
    assert counts[1].remediation == ("fleet", "fleet", "--attention-backend", "drop_flag")
    assert counts[2].launch == "start"  # a fleet fix changes the first launch, ends none
    doc = model.public(snap, 5.0, "0.5.23")
    assert doc["fleet_fix"]["key"] == "k" * 64
    assert doc["fleet_fix"]["origin"]["guard"] == "node-1:abcd"
    assert doc["fleet_fix"]["edits"] == [{"flag": "--attention-backend", "action": "drop_flag",
                                          "old_value": "fa3", "new_value": None}]
    snap, _ = model.on_record(snap, typed({"event": "fleet.known_bad"}), 9.0, 1009.0)
    assert model.public(snap, 10.0, None)["fleet_fix"] is None


@pytest.mark.parametrize(("record", "kinds"), [
    ({"event": "fleet.lookup", "result": "miss"}, ("lookup",)),
    ({"event": "fleet.lookup", "result": "known_bad"}, ("lookup", "known_bad_skip")),
    ({"event": "fleet.lookup", "result": "unavailable"}, ("lookup", "store_error")),
    ({"event": "fleet.lookup", "result": "error"}, ("lookup", "store_error")),
    ({"event": "fleet.refused"}, ("lookup", "refused")),
    ({"event": "fleet.published"}, ("publish",)),
    ({"event": "fleet.known_bad"}, ("known_bad",)),
    ({"event": "fleet.error"}, ("store_error",)),
])
def test_every_fleet_record_counts_a_registered_kind(record: dict[str, Any],
                                                     kinds: tuple[str, ...]) -> None:
    _, counts = fold([record])
    assert counts[0].fleet == kinds
    assert set(kinds) <= set(model.FLEET_KINDS)



@pytest.mark.parametrize("cause", list(StopCause))
def test_the_restart_cause_comes_from_the_stops_cause_not_its_wording(cause: StopCause) -> None:
    assert model.on_stop(model.Snapshot(), cause).cause == str(cause)
    # A Stop without a cause (a rule, a signal, the group) names none, whatever its reason says.
    assert model.on_stop(model.Snapshot(), None).cause is None
    # The first cause of a stop sticks until the next launch.
    assert model.on_stop(model.on_stop(model.Snapshot(), cause), None).cause == str(cause)
