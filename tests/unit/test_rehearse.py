"""`machine.rehearse` (a throwaway launch through a crash banner and a fatal line) and the
pipes' reading rehearsal (`supervisor.rehearse_reading`).

It warms the line path (timed by bench/compare/flood.py, never here) and must change nothing
a real launch decides: the same lines after it get the same fix, and the state it used is
not the caller's.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sglang_guard.preflight.shell.inputs import read_command_line
from sglang_guard.rules import rules as rules_module
from sglang_guard.rules.linereader import Line
from sglang_guard.rules.rules import Matcher, load_default_packs
from sglang_guard.sglang.releases import load_option_table
from sglang_guard.supervise import machine
from sglang_guard.supervise.actions import Stop
from sglang_guard.supervise.events import ChildLine
from sglang_guard.supervise.replay import env_for
from sglang_guard.supervise.shell import supervisor

OPTIONS = load_option_table()
CRASH = "[2026-01-01 00:00:00] Scheduler hit an exception: Traceback (most recent call last):"
FA3 = ("ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90. "
       "Please use `--attention-backend flashinfer`.")


def _decide(env: machine.Env, argv: list[str]) -> tuple[object, list[str]]:
    """The fix a launch of `argv` takes from CRASH then FA3, and its actions' kinds."""
    state, _ = machine.start(machine.State(cl=read_command_line(argv, OPTIONS)), env)
    kinds: list[str] = []
    for i, text in enumerate((CRASH, FA3)):
        state, actions = machine.step(state, ChildLine(state.gen, "stderr", text, len(text),
                                                       True, i == 1), env, 0.0, 0.5)
        kinds += [type(a).__name__ for a in actions]
    return state.decided, kinds


def test_rehearsal_changes_no_decision() -> None:
    argv = ["--model-path", "/m", "--attention-backend", "fa3"]
    cold = env_for(Matcher(load_default_packs()), OPTIONS, sm=100, sglang_version="0.5.23",
                   arch="mha")
    warm = replace(cold, matcher=Matcher(load_default_packs()))
    machine.rehearse(warm, read_command_line(argv, OPTIONS))
    assert _decide(warm, argv) == _decide(cold, argv)
    fix, kinds = _decide(warm, argv)
    assert fix is not None and "Stop" in kinds


def test_rehearsal_runs_the_line_path_and_keeps_nothing_but_caches() -> None:
    matcher = Matcher(load_default_packs())
    env = env_for(matcher, OPTIONS, sm=90, sglang_version="0.5.23", arch="mla")
    cl = read_command_line(["--model-path", "/m", "--tp", "2"], OPTIONS)
    before = (env, cl)
    machine.rehearse(env, cl)
    assert (env, cl) == before
    # Its lines went through the matcher (their answers are cached), and the fatal one is a
    # fix of the default pack: the fix path ran, not only the scan.
    assert matcher.candidates(machine.REHEARSAL_LINES[0], True)
    found = matcher.candidates(machine.REHEARSAL_LINES[1], True)
    assert [r.id for r in found] == ["hpc-ops-mla-model"]


def test_rehearsal_on_a_command_line_that_cannot_take_the_fix() -> None:
    """A table without the flag, an empty pack: it runs, and raises nothing."""
    env = env_for(Matcher(()), OPTIONS, sglang_version="0.5.1")
    machine.rehearse(env, read_command_line(["--model-path", "/m"], OPTIONS))
    state, actions = machine.start(machine.State(cl=read_command_line(["--model-path", "/m"],
                                                                      OPTIONS)), env)
    assert not any(isinstance(a, Stop) for a in actions) and state.phase == "starting"



def test_rehearsal_parses_every_rule_range_against_the_release() -> None:
    """The first fatal line's decision finds each rule's release range parsed (one answer per
    range, kept by rules._version_in), whichever rule it is; none without a known release."""
    matcher = Matcher(load_default_packs())
    ranges = {r.conditions.sglang for r in matcher.rules if r.conditions.sglang}
    assert len(ranges) > 5
    cl = read_command_line(["--model-path", "/m"], OPTIONS)
    rules_module._version_in.cache_clear()
    machine.rehearse(env_for(matcher, OPTIONS, sglang_version=None), cl)
    assert rules_module._version_in.cache_info().currsize == 0
    machine.rehearse(env_for(matcher, OPTIONS, sglang_version="0.5.23"), cl)
    assert rules_module._version_in.cache_info().currsize == len(ranges)


def test_the_reading_rehearsal_reads_the_fatal_line_as_a_pump_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`rehearse_reading` takes its chunk through the scan, the line reading and `keeps`, in
    both phases: the crash banner (a catch-all of both) reaches `keeps` each time, the fatal
    line (a start-phase rule's) while starting, the frame never."""
    kept: list[str] = []
    keeps = supervisor.keeps

    def recording(matcher: Matcher, line: Line) -> bool:
        kept.append(line.text)
        return keeps(matcher, line)

    monkeypatch.setattr(supervisor, "keeps", recording)
    matcher = Matcher(load_default_packs())
    matcher.prepare_scan()
    supervisor.rehearse_reading(matcher)
    banner, fatal = machine.REHEARSAL_LINES
    assert kept == [banner, fatal, banner]
    supervisor.rehearse_reading(Matcher(()))  # an empty pack: nothing to read, no error
