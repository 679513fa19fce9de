"""Advice rules in the supervision loop: journaled with the record's advice, nothing changed."""

from __future__ import annotations

from sglang_guard.config.guardconfig import HealthSection, RestartSection
from sglang_guard.rules.rules import Matcher, parse_pack
from sglang_guard.supervise import machine
from sglang_guard.supervise.actions import Spawn, Stop
from support.machinerun import OPTIONS, Run, events_of, of, only, record

PACK = parse_pack("""
[pack]
name = "ds"
sglang_versions = ">=0.5.23"

[[rules]]
id = "fa3-advice"
record = "rec-fa3"
pattern = '\\bAssertionError: (?:FlashAttention v3 Backend requires SM>=80)'
action = "advice"
reason = "no automatic action: the example changes 2 flags at once"
explanation = "fa3 runs on Hopper and Ampere only."
solutions = ["Run on an SM80-SM90 GPU", "Use --attention-backend flashinfer"]

[[rules]]
id = "hpc-drop"
record = "rec-hpc"
pattern = 'hpc_ops backend can only be used with non-MLA models'
action = "drop_flag"
flags = ["--attention-backend"]

[[rules]]
id = "hpc-advice"
record = "rec-hpc-2"
pattern = 'hpc_ops backend can only be'
action = "advice"
priority = 5
""", "ds.toml")
FA3 = "AssertionError: FlashAttention v3 Backend requires SM>=80 and SM<=90."
HPC = "ValueError: hpc_ops backend can only be used with non-MLA models."


def env() -> machine.Env:
    return machine.Env(options=OPTIONS, matcher=Matcher([PACK]),
                       restart=RestartSection(max_failures=2, backoff_initial_s=1.0),
                       health=HealthSection(), arch="unknown", sm=None, sglang_version=None,
                       derived_dir="/tmp/derived")


def test_an_advice_line_is_journaled_and_changes_nothing() -> None:
    run = Run(env=env(), argv=("--model-path", "/m", "--attention-backend", "fa3"))
    run.start()
    actions = run.line(FA3)
    advice = record(actions, "advice")
    assert advice["rule"] == "fa3-advice" and advice["record"] == "rec-fa3"
    assert advice["solutions"] == ["Run on an SM80-SM90 GPU", "Use --attention-backend flashinfer"]
    assert advice["explanation"] == "fa3 runs on Hopper and Ampere only."
    assert advice["line"] == FA3
    assert not of(actions, Stop)  # no restart, no remediation
    assert "remediated" not in events_of(actions)
    assert run.state.fired == {} and run.state.tentative is None
    # SGLang exits on its own: the same command line again, as for any crash.
    run.exited(1)
    spawn: Spawn = run.backoff_then_spawn()
    assert spawn.argv == ("--model-path", "/m", "--attention-backend", "fa3")
    assert "remediated" not in events_of(run.log)


def test_advice_never_hides_a_rule_that_fixes_the_same_line() -> None:
    run = Run(env=env(), argv=("--model-path", "/m", "--attention-backend", "hpc_ops"))
    run.start()
    actions = run.line(HPC)
    assert record(actions, "advice")["rule"] == "hpc-advice"
    fix = record(actions, "remediated")
    assert (fix["rule"], fix["flag"], fix["action"]) == ("hpc-drop", "--attention-backend",
                                                         "drop_flag")
    only(actions, Stop)
