"""The start-up watch: stages from SGLang's markers, progress, `start.stalled` (fake clock)."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_guard.config.guardconfig import (
    HealthSection,
    RestartSection,
    StartSection,
    parse_guard_config,
)
from sglang_guard.errors import EXIT_GIVE_UP, InputError
from sglang_guard.rules.rules import BlockHits, Matcher, load_default_packs
from sglang_guard.rules.stages import MARKERS, READY_LINE
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.releases import load_option_table
from sglang_guard.supervise import machine
from sglang_guard.supervise.actions import Action, Exit, Journal, Schedule, Spawn, Stop
from sglang_guard.supervise.events import ChildExited, ChildLine, ChildOutput, ChildStage, Tick

OPTIONS = load_option_table()
MATCHER = Matcher(load_default_packs())
ARGV = ("--model-path", "/m", "--nnodes", "2", "--node-rank", "0", "--tp", "2")
REC = "[2026-12-01 09:09:48 TP0] "


class Run:
    """One scripted start against a fake clock."""

    def __init__(self, start: StartSection) -> None:
        self.env = machine.Env(options=OPTIONS, matcher=MATCHER,
                               restart=RestartSection(max_failures=5), health=HealthSection(),
                               arch="unknown", sm=None, sglang_version=None,
                               derived_dir="/tmp/d", start=start)
        self.state = machine.State(cl=parse_command_line(ARGV, OPTIONS))
        self.now = 100.0
        self.state, self.first = machine.start(self.state, self.env)

    def send(self, event: Any, after: float = 0.0) -> list[Action]:
        self.now += after
        self.state, actions = machine.step(self.state, event, self.env, self.now, 0.5)
        return actions

    def due(self, actions: list[Action]) -> tuple[Schedule, float]:
        """The stall timer just scheduled, and when (on the fake clock) it falls due."""
        (timer,) = [a for a in actions if isinstance(a, Schedule) and a.name.startswith("stall")]
        return timer, self.now + timer.delay

    def fire(self, due: tuple[Schedule, float]) -> list[Action]:
        timer, at = due
        assert at >= self.now, "ticks come in time order"
        self.now = at
        return self.send(Tick(timer.name, timer.gen))


def events(actions: list[Action]) -> list[str]:
    return [str(a.record.event) for a in actions if isinstance(a, Journal)]


def record(actions: list[Action], name: str) -> dict[str, Any]:
    (found,) = [a.record.to_record() for a in actions if isinstance(a, Journal)
                and a.record.event == name]
    return found


def test_silent_dist_init_stalls_within_its_limit_and_restarts() -> None:
    run = Run(StartSection(init_s=300.0, dist_init_s=30.0))
    assert run.due(run.first)[0].delay == 300.0  # the init stage's limit, from the spawn
    run.send(ChildOutput(1, "stderr", REC + "server_args=ServerArgs(...)", False), after=5)
    staged = run.send(ChildStage(1, "dist_init"), after=10)
    assert events(staged) == ["start.stage"]
    short = run.due(staged)
    assert short[0].delay == 30.0  # the new stage's own limit applies at once
    line = REC + "init_cpu_threads_env and shared memory based AllReduce is disabled"
    run.send(ChildOutput(1, "stderr", line, False))
    actions = run.fire(short)
    stalled = record(actions, "start.stalled")
    assert stalled["stage"] == "dist_init" and stalled["line"] == line
    assert stalled["silent_s"] == 30.0 and stalled["action"] == "restart"
    assert run.state.stalled is not None and run.state.stalled.stage == "dist_init"
    assert [a for a in actions if isinstance(a, Stop)] == [Stop(1, "start stalled")]
    after = run.send(ChildExited(1, 7, -15), after=1)
    assert "backoff" in events(after)  # counted as a failure: backoff, then the next launch
    assert run.state.phase == "backoff"


def test_progress_moves_the_deadline_and_bars_count() -> None:
    run = Run(StartSection(init_s=100.0, weights_s=60.0))
    timer = run.due(run.send(ChildStage(1, "weights"), after=1))
    run.send(ChildOutput(1, "stderr", "Loading safetensors checkpoint shards:  50%", True),
             after=50)
    later = run.due(run.fire(timer))  # 10 s after the bar: not stalled, a new deadline
    assert later[0].delay == pytest.approx(50.0)
    run.send(ChildOutput(1, "stderr", "[W socket.cpp:663] client socket failed", False),
             after=20)  # not SGLang's own output: no progress
    actions = run.fire(later)
    assert record(actions, "start.stalled")["stage"] == "weights"


def test_a_sglang_record_line_is_progress_and_the_last_line() -> None:
    run = Run(StartSection(init_s=100.0))
    timer = run.due(run.first)
    run.send(ChildLine(1, "stderr", REC + "Load weight end. elapsed=0.02 s", 10), after=90)
    later = run.due(run.fire(timer))
    assert later[0].delay == pytest.approx(90.0)
    assert run.state.last_line.endswith("Load weight end. elapsed=0.02 s")


def test_give_up_on_stall_exits_75_after_the_stop() -> None:
    run = Run(StartSection(init_s=10.0, on_stall="give_up"))
    actions = run.fire(run.due(run.first))
    assert events(actions) == ["start.stalled", "give_up.planned"]
    stalled = record(actions, "start.stalled")
    assert stalled["stage"] == "init" and stalled["line"] == ""
    done = run.send(ChildExited(1, 7, -15), after=1)
    assert [a.code for a in done if isinstance(a, Exit)] == [EXIT_GIVE_UP]
    assert not [a for a in done if isinstance(a, Spawn)]


def test_a_zero_limit_turns_a_stage_off_and_older_timers_are_ignored() -> None:
    run = Run(StartSection(init_s=10.0, warmup_s=0.0))
    first = run.due(run.first)
    staged = run.send(ChildStage(1, "warmup"), after=1)
    assert [a for a in staged if isinstance(a, Schedule)] == []
    assert run.fire(first) == []  # the init timer is stale: the stage changed since


def test_ready_ends_the_watch() -> None:
    run = Run(StartSection(init_s=10.0))
    timer = run.due(run.first)
    run.send(ChildLine(1, "stdout", machine.READY_LINE, 1))
    run.send(machine.HealthResult(1, "/health", True, "200"))
    assert run.state.phase == "ready"
    assert run.fire(timer) == []


def test_the_same_stage_again_is_progress_only() -> None:
    run = Run(StartSection(init_s=100.0, weights_s=100.0))
    run.send(ChildStage(1, "weights"), after=1)
    assert run.send(ChildStage(1, "weights"), after=1) == []  # TP1 prints it too


def test_scan_finds_the_last_marker_of_a_block_in_one_pass() -> None:
    block = (f"{REC}Init parallel begin.\n{REC}Init parallel ends. elapsed=0.1 s\n"
             f"{REC}Load weight begin. avail mem=20 GB\n").encode()
    assert MATCHER.scan(block) == BlockHits(rule=False, stage="weights", ready=False)
    assert MATCHER.scan(b"[x] healthy\n") == BlockHits(rule=False, stage=None, ready=False)
    found = MATCHER.scan(f"{REC}Capture target decode cuda graph begin. bs=[1]\n".encode())
    assert (found.rule, found.stage) == (False, "cuda_graph")
    found = MATCHER.scan(b"ValueError: hpc_ops backend can only be used with non-MLA "
                         b"models.\n" + f"{REC}Init parallel begin.\n".encode())
    assert found.rule and found.stage == "dist_init" and not found.ready
    found = MATCHER.scan(f"{REC}Load weight end.\n{REC}{READY_LINE}\n".encode())
    assert found == BlockHits(rule=False, stage="init", ready=True)
    assert {m[0] for m in MARKERS} <= {"init", "dist_init", "weights", "cuda_graph", "warmup"}


def test_guard_config_start_section() -> None:
    cfg = parse_guard_config("[start]\ndist_init_s = 45\non_stall = \"give_up\"\n", "g.toml")
    assert cfg.start.limit("dist_init") == 45.0 and cfg.start.on_stall == "give_up"
    assert cfg.start.limit("weights") == StartSection().weights_s
    with pytest.raises(InputError, match="on_stall"):
        parse_guard_config("[start]\non_stall = \"ignore\"\n", "g.toml")
    with pytest.raises(InputError, match="weight_s"):
        parse_guard_config("[start]\nweight_s = 1\n", "g.toml")
