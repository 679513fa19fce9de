"""The supervision state machine, driven by scripted event histories: fake clock, fixed jitter."""

from __future__ import annotations

import json
import signal
from dataclasses import replace

import pytest

from sglang_guard.common.outcomes import StopCause
from sglang_guard.config.guardconfig import HealthSection
from sglang_guard.errors import EXIT_GIVE_UP, EXIT_OK
from sglang_guard.rules.rules import Matcher, parse_pack
from sglang_guard.supervise import machine
from sglang_guard.supervise.actions import (
    Exit,
    Journal,
    Notify,
    Probe,
    Reload,
    Schedule,
    Spawn,
    Stop,
)
from sglang_guard.supervise.events import (
    ChildExited,
    ChildLine,
    FileChanged,
    HealthResult,
    SignalReceived,
    Tick,
)
from support.machinerun import (
    ARGV,
    Run,
    delay_of,
    events_of,
    make_env,
    of,
    only,
    record,
)
from support.pack import CRASH_LINE, DRAFT_LINE, FA3_LINE

# --- start and readiness -------------------------------------------------------------------


def test_start_spawns_launch_one_with_a_ready_timeout() -> None:
    run = Run(make_env(ready_timeout_s=77.0))
    actions = run.start()
    assert only(actions, Spawn) == Spawn(1, ARGV)
    assert record(actions, "child.start")["argv"] == list(ARGV)
    assert Schedule("ready_timeout", 1, 77.0) in actions
    assert run.state.phase == "starting"


def test_ready_is_the_line_confirmed_by_health_200_and_503_is_retried() -> None:
    run = Run()
    run.start()
    assert run.line("loading weights ...") == []
    assert run.line(machine.READY_LINE) == [Probe(1, "/health")]
    assert run.state.phase == "starting"
    assert run.line(machine.READY_LINE) == []  # the line twice asks once
    assert run.health("/health", ok=False) == [Schedule("health_retry", 1, machine.HEALTH_RETRY_S)]
    assert run.state.phase == "starting"
    assert run.tick("health_retry") == [Probe(1, "/health")]
    actions = run.health("/health", ok=True)
    assert run.state.phase == "ready"
    assert run.state.last_ready == run.state.cl
    assert record(actions, "ready")["gen"] == 1
    assert Notify(ready=True, status="ready") in actions
    assert {a.name for a in of(actions, Schedule)} == {"stable", "liveness"}


def test_health_disabled_the_ready_line_alone_says_ready() -> None:
    run = Run(make_env(health=HealthSection(enabled=False)))
    run.start()
    actions = run.line(machine.READY_LINE)
    assert of(actions, Probe) == []
    assert run.state.phase == "ready"
    assert {a.name for a in of(actions, Schedule)} == {"stable"}  # and no liveness probing


def test_not_ready_in_time_restarts_as_a_failure() -> None:
    run = Run()
    run.start()
    assert run.tick("ready_timeout") == [Stop(1, "ready timeout", StopCause.READY_TIMEOUT)]
    actions = run.exited(-15)
    assert "backoff" in events_of(actions)
    assert run.backoff_then_spawn() == Spawn(2, ARGV)


def test_a_stale_ready_timeout_after_ready_does_nothing() -> None:
    run = Run()
    run.start()
    run.ready()
    assert run.tick("ready_timeout") == []


# --- fatal lines ---------------------------------------------------------------------------


def test_fatal_line_stops_then_the_exit_spawns_the_fixed_argv() -> None:
    run = Run()
    run.start()
    actions = run.line(FA3_LINE)
    assert actions[-1] == Stop(1, "rule fa3-sm")
    rec = record(actions, "remediated")
    fixed = ["--model-path", "/m", "--port", "31000"]
    assert {k: rec[k] for k in ("trigger", "rule", "flag", "action", "line", "old_value")} == {
        "trigger": "log", "rule": "fa3-sm", "flag": "--attention-backend",
        "action": "drop_flag", "line": FA3_LINE, "old_value": "fa3"}
    assert (rec["argv_before"], rec["argv_after"]) == (list(ARGV), fixed)
    assert run.state.phase == "stopping"
    assert run.line(FA3_LINE) == []  # the rest of the dying child's burst is not acted on
    actions = run.exited(1)
    assert record(actions, "child.exit")["returncode"] == 1
    assert only(actions, Spawn) == Spawn(2, tuple(fixed))
    assert "backoff" not in events_of(actions)  # a fix is not a crash: no backoff
    assert run.state.failures == ()


def test_set_flag_fix_appends_the_flag() -> None:
    run = Run(argv=("--model-path", "/m"))
    run.start()
    run.line("RuntimeError: draft backend needs MLA")
    spawn = only(run.exited(1), Spawn)
    assert spawn.argv == ("--model-path", "/m", "--speculative-draft-attention-backend", "triton")


def test_secrets_never_reach_the_journal() -> None:
    run = Run(argv=(*ARGV, "--api-key", "sekrit-123"))
    run.start()
    run.line(FA3_LINE)
    run.exited(1)
    text = json.dumps([a.record.to_record() for a in of(run.log, Journal)])
    assert "sekrit-123" not in text
    assert "***" in text
    assert only(run.log[-5:], Spawn).argv[-1] == "sekrit-123"  # the child still gets it


def test_non_fatal_and_unmatched_lines_do_nothing() -> None:
    run = Run()
    run.start()
    assert run.line("harmless warning: something") == []
    assert run.line("nothing to see") == []
    assert run.state.phase == "starting"


def test_fatal_line_after_ready_acts_at_once() -> None:
    run = Run()
    run.start()
    run.ready()
    assert of(run.line(FA3_LINE), Stop) == [Stop(1, "rule fa3-sm")]


def test_give_up_rule_stops_then_exits_75() -> None:
    run = Run()
    run.start()
    actions = run.line("OSError: [Errno 98] address already in use")
    assert record(actions, "give_up.planned")["rule"] == "port-busy"
    assert actions[-1] == Stop(1, "rule port-busy")
    actions = run.exited(1)
    assert actions[-1] == Exit(EXIT_GIVE_UP, "port-busy: the port is taken")
    assert run.state.phase == "done"
    assert run.send(Tick("backoff", 1)) == []  # done is done


def test_restart_rule_counts_as_a_failure_with_backoff() -> None:
    run = Run()
    run.start()
    assert run.line(CRASH_LINE) == [Schedule("settle", 1, machine.SETTLE_S)]
    actions = run.tick("settle")
    assert record(actions, "crash.detected")["rule"] == "crash"
    assert actions[-1] == Stop(1, "rule crash")
    actions = run.exited(-15)
    assert record(actions, "backoff")["reason"] == "scheduler crashed"
    assert delay_of(actions, "backoff") == pytest.approx(1.0 * 1.125)
    assert len(run.state.failures) == 1
    assert run.backoff_then_spawn() == Spawn(2, ARGV)  # the same command line


# --- the settle window of a catch-all ------------------------------------------------------


def test_catch_all_waits_and_a_specific_line_of_the_same_crash_wins() -> None:
    run = Run()
    run.start()
    run.line(CRASH_LINE)
    assert run.line(CRASH_LINE) == []  # one settle window per crash
    actions = run.line(FA3_LINE)
    assert record(actions, "remediated")["rule"] == "fa3-sm"
    assert "crash.detected" not in events_of(run.log)
    assert run.tick("settle") == []  # the window closing later changes nothing
    spawn = only(run.exited(1), Spawn)
    assert "fa3" not in spawn.argv
    assert run.state.failures == ()


def test_catch_all_child_dies_inside_the_window_counts_the_crash() -> None:
    run = Run()
    run.start()
    run.line(CRASH_LINE)
    actions = run.exited(1)
    assert events_of(actions)[:3] == ["child.exit", "crash.detected", "backoff"]
    assert of(actions, Stop) == []  # nothing left to stop
    assert run.state.phase == "backoff"


# --- crash loops and backoff ---------------------------------------------------------------


def test_exits_back_off_exponentially_then_give_up_with_75() -> None:
    run = Run(make_env(max_failures=3, window_s=60.0, backoff_initial_s=1.0, backoff_factor=2.0))
    run.start()
    delays = []
    for _ in range(2):
        actions = run.exited(1, after=1.0)
        delays.append(delay_of(actions, "backoff"))
        run.backoff_then_spawn()
    assert delays == pytest.approx([1.125, 2.25])
    actions = run.exited(1, after=1.0)
    exit_ = actions[-1]
    assert isinstance(exit_, Exit)
    assert exit_.code == EXIT_GIVE_UP
    assert "crash loop: 3 failures within 60s" in exit_.reason
    assert record(actions, "give_up")["reason"] == exit_.reason
    assert of(actions, Spawn) == []


def test_backoff_is_clamped_to_its_maximum() -> None:
    run = Run(make_env(max_failures=99, backoff_initial_s=1.0, backoff_factor=10.0,
                       backoff_max_s=5.0))
    run.start()
    for _ in range(3):
        delay = delay_of(run.exited(1), "backoff")
        run.backoff_then_spawn()
    assert delay == pytest.approx(5.0 * 1.125)


def test_failures_outside_the_window_do_not_count() -> None:
    run = Run(make_env(max_failures=2, window_s=60.0))
    run.start()
    for _ in range(4):
        actions = run.exited(1, after=100.0)
        assert of(actions, Exit) == []
        run.backoff_then_spawn()


def test_a_stable_run_resets_the_backoff() -> None:
    run = Run(make_env(max_failures=99, backoff_initial_s=1.0, backoff_factor=2.0))
    run.start()
    for _ in range(3):
        run.exited(1)
        run.backoff_then_spawn()
    assert run.state.attempt == 3
    run.ready()
    assert record(run.tick("stable"), "stable")["gen"] == run.gen
    assert run.state.attempt == 0
    assert delay_of(run.exited(1), "backoff") == pytest.approx(1.125)


def test_stable_tick_before_ready_does_not_reset() -> None:
    run = Run(make_env(max_failures=99))
    run.start()
    run.exited(1)
    run.backoff_then_spawn()
    assert run.tick("stable") == []
    assert run.state.attempt == 1


# --- a fix that did not hold ---------------------------------------------------------------


def test_same_rule_again_without_a_ready_argv_gives_up() -> None:
    run = Run(argv=("--model-path", "/m"))
    run.start()
    run.line(DRAFT_LINE)
    run.exited(1)
    waiting = run.line(DRAFT_LINE)  # a later line of the burst may still fix it
    assert Schedule("settle", 2, machine.SETTLE_S) in waiting
    assert not of(waiting, Stop)
    actions = run.tick("settle")
    planned = record(actions, "give_up.planned")
    assert planned["rule"] == "draft-triton"
    assert "fired again after its fix" in planned["reason"]
    assert of(actions, Stop) == [Stop(2, "repeat draft-triton")]
    exit_ = run.exited(1)[-1]
    assert isinstance(exit_, Exit)
    assert exit_.code == EXIT_GIVE_UP
    assert "no earlier command line reached ready" in exit_.reason


def test_same_rule_again_restores_the_last_argv_that_reached_ready() -> None:
    run = Run(argv=("--model-path", "/m"))
    run.start()
    run.ready()
    run.line(DRAFT_LINE)  # after ready: acts at once
    fixed = only(run.exited(1), Spawn).argv
    assert fixed[-2:] == ("--speculative-draft-attention-backend", "triton")
    run.line(DRAFT_LINE)
    actions = run.tick("settle")
    assert record(actions, "restored")["argv_after"] == ["--model-path", "/m"]
    assert of(actions, Stop) == [Stop(2, "repeat draft-triton")]
    assert only(run.exited(1), Spawn) == Spawn(3, ("--model-path", "/m"))
    # Once more on the restored line: nothing better is left, so give up.
    run.ready()
    run.line(DRAFT_LINE)
    exit_ = run.exited(1)[-1]  # the child died inside the settle window: act on it now
    assert isinstance(exit_, Exit)
    assert exit_.code == EXIT_GIVE_UP


def test_a_fix_named_later_in_the_burst_wins_over_a_repeat() -> None:
    run = Run(argv=("--model-path", "/m", "--attention-backend", "fa3"))
    run.start()
    run.line(DRAFT_LINE)
    assert only(run.exited(1), Spawn).argv[-2:] == ("--speculative-draft-attention-backend",
                                                     "triton")
    run.line(DRAFT_LINE)  # fired before, nothing left to change: waits
    actions = run.line(FA3_LINE)
    assert record(actions, "remediated")["rule"] == "fa3-sm"
    assert not any(r.record.event in ("restored", "give_up.planned")
                   for r in of(actions, Journal))
    spawn = only(run.exited(1), Spawn)
    assert "--attention-backend" not in spawn.argv


def test_multi_flag_rule_with_nothing_left_to_drop_counts_as_a_repeat() -> None:
    run = Run(argv=("--model-path", "/m", "--attention-backend", "x"))
    run.start()
    run.line("ValueError: backend pair is bad")
    assert only(run.exited(1), Spawn).argv == ("--model-path", "/m")
    run.line("ValueError: backend pair is bad")  # a fire is left, but no flag to drop
    actions = run.tick("settle")
    assert record(actions, "give_up.planned")["rule"] == "two-flags"


def test_multi_flag_rule_drops_one_flag_per_fire() -> None:
    run = Run(argv=("--model-path", "/m", "--decode-attention-backend", "a",
                    "--attention-backend", "b"))
    run.start()
    run.line("ValueError: backend pair is bad")
    assert only(run.exited(1), Spawn).argv == ("--model-path", "/m", "--attention-backend", "b")
    run.line("ValueError: backend pair is bad")
    assert only(run.exited(1), Spawn).argv == ("--model-path", "/m")


# --- liveness --------------------------------------------------------------------------------


def test_liveness_failure_streak_after_ready_restarts() -> None:
    run = Run(make_env(health=HealthSection(liveness_interval_s=5.0, liveness_failures=2)))
    run.start()
    run.ready()
    assert run.tick("liveness") == [Probe(1, "/health_generate")]
    actions = run.health("/health_generate", ok=False)
    assert record(actions, "liveness.failed")["streak"] == 1
    assert Schedule("liveness", 1, 5.0) in actions
    actions = run.health("/health_generate", ok=True)  # a success breaks the streak
    assert Notify(watchdog=True) in actions
    assert run.state.liveness_streak == 0
    run.health("/health_generate", ok=False)
    actions = run.health("/health_generate", ok=False)
    assert record(actions, "liveness.failed")["streak"] == 2
    assert actions[-1] == Stop(1, "liveness", StopCause.LIVENESS)
    actions = run.exited(-15)
    assert record(actions, "backoff")["reason"] == "liveness probe failed"
    assert run.backoff_then_spawn() == Spawn(2, ARGV)


def test_liveness_results_before_ready_are_ignored() -> None:
    run = Run()
    run.start()
    assert run.health("/health_generate", ok=False) == []
    assert run.tick("liveness") == []


# --- generations -----------------------------------------------------------------------------


def test_late_events_of_an_old_launch_are_ignored() -> None:
    run = Run()
    run.start()
    run.line(FA3_LINE)
    run.exited(1)
    assert run.gen == 2
    before = run.state
    assert run.send(ChildLine(1, "stderr", FA3_LINE, 10)) == []
    assert run.send(HealthResult(1, "/health", True, "HTTP 200")) == []
    assert run.send(Tick("ready_timeout", 1)) == []
    assert run.send(ChildExited(1, 4242, -9)) == []
    assert run.state == before


# --- signals and reloads ---------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_term_stops_the_tree_then_exits_0(signum: int) -> None:
    run = Run()
    run.start()
    run.ready()
    actions = run.send(SignalReceived(signum))
    assert record(actions, "guard.signal")["signal"] == signal.Signals(signum).name
    assert actions[-1] == Stop(1, "signal")
    assert of(run.exited(-15), Exit) == [Exit(EXIT_OK, "stopped by signal")]


def test_term_while_stopping_for_a_fix_exits_instead_of_restarting() -> None:
    run = Run()
    run.start()
    run.line(FA3_LINE)
    run.send(SignalReceived(signal.SIGTERM))
    actions = run.exited(1)
    assert of(actions, Spawn) == []
    assert actions[-1] == Exit(EXIT_OK, "stopped by signal")


def test_term_during_backoff_exits_at_once() -> None:
    run = Run()
    run.start()
    run.exited(1)
    actions = run.send(SignalReceived(signal.SIGTERM))
    assert of(actions, Stop) == []
    assert actions[-1] == Exit(EXIT_OK, "stopped by signal")
    assert run.tick("backoff") == []


def test_hup_reloads_and_file_changes_reload_that_file() -> None:
    run = Run()
    run.start()
    state = run.state
    assert run.send(SignalReceived(signal.SIGHUP)) == [Reload("guard_config", None)]
    assert run.send(FileChanged("/etc/r.toml", "rule_pack")) == [Reload("rule_pack", "/etc/r.toml")]
    assert run.state == state  # the child keeps running


def test_a_reloaded_env_applies_to_new_lines() -> None:
    run = Run()
    run.start()
    run.env = replace(run.env, matcher=Matcher([]))
    assert run.line(FA3_LINE) == []


# --- the parser rejects the guard's own edit ------------------------------------------------

UNDO_PACK = parse_pack(
    """
[pack]
name = "u"
sglang_versions = ">=0.5.1"

[[rules]]
id = "kv-fix"
pattern = 'KV pool too small'
action = "set_flag"
flags = ["--kv-cache-dtype"]
new_value = "fp8_e4m3"

[[rules]]
id = "undo"
pattern = 'error: argument --[a-z-]+: invalid choice: '
action = "undo_guard_edit"
priority = 10
""",
    "u.toml",
)
REJECT = ("launch_server.py: error: argument --kv-cache-dtype: invalid choice: 'fp8_e4m3' "
          "(choose from 'auto', 'fp8_e5m2')")


def test_a_parser_rejection_of_the_guards_own_edit_restores_the_line_before_it() -> None:
    run = Run(env=replace(make_env(), matcher=Matcher([UNDO_PACK])))
    run.start()
    first = run.state.cl
    run.line("RuntimeError: KV pool too small")
    run.exited(1)
    assert run.state.cl.argv[-2:] == ("--kv-cache-dtype", "fp8_e4m3")
    acts = run.line(REJECT)
    rec = record(acts, "remediated")
    assert (rec["rule"], rec["action"], rec["flag"]) == ("undo", "undo", "--kv-cache-dtype")
    spawn = only(run.exited(2), Spawn)
    assert spawn.argv == first.argv  # back to the command line before the guard's fix
    # The fix that caused it has used its budget: the same line does not repeat it.
    assert run.state.fired["kv-fix"] == 1


def test_a_parser_rejection_the_guard_did_not_cause_undoes_nothing() -> None:
    run = Run(env=replace(make_env(), matcher=Matcher([UNDO_PACK])))
    run.start()
    assert events_of(run.line(REJECT)) == []  # the user's own flag: no undo, no fix


REFUSE_PACK = parse_pack(
    """
[pack]
name = "r"
sglang_versions = ">=0.5.1"

[[rules]]
id = "bad-value"
pattern = 'boom'
action = "set_flag"
flags = ["--served-model-name"]
new_value = "--not-a-value"
priority = 5

[[rules]]
id = "next-rung"
pattern = 'boom'
action = "drop_flag"
flags = ["--attention-backend"]
""",
    "r.toml",
)


def test_a_fix_the_parser_would_reject_is_not_launched_the_next_rung_is() -> None:
    run = Run(env=replace(make_env(), matcher=Matcher([REFUSE_PACK])))
    run.start()
    acts = run.line("RuntimeError: boom")
    assert record(acts, "fix.refused")["rule"] == "bad-value"
    assert record(acts, "remediated")["rule"] == "next-rung"
    spawn = only(run.exited(1), Spawn)
    assert "--not-a-value" not in spawn.argv and "--attention-backend" not in spawn.argv


def test_with_no_rung_left_the_guard_gives_up_with_the_parsers_reason() -> None:
    run = Run(env=replace(make_env(), matcher=Matcher([REFUSE_PACK])),
              argv=("--model-path", "/m", "--port", "31000"))
    run.start()
    acts = run.line("RuntimeError: boom")
    reason = record(acts, "give_up.planned")["reason"]
    assert reason.startswith("bad-value: SGLang would reject the edited command line (")
    exit_ = only(run.exited(1), Exit)
    assert exit_.code == EXIT_GIVE_UP
