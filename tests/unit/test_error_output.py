"""Rules read SGLang's own error output only (issue 12): never request text, access lines,
quoted strings; and after ready only running-phase rules act."""

from __future__ import annotations

from pathlib import Path

import pytest

from requestlines import ENV_LINES, FATAL_TEXTS, quoting
from sglang_guard.config.guardconfig import GuardConfig, HealthSection, RestartSection
from sglang_guard.errors import EXIT_ENVIRONMENT
from sglang_guard.rules.logline import clean, error_text
from sglang_guard.rules.rules import MatchContext, Matcher, first_fix, load_default_packs
from sglang_guard.rules.shell.explain import explain_log
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.releases import load_option_table
from sglang_guard.supervise import machine
from sglang_guard.supervise.actions import Exit, Journal, Spawn, Stop
from sglang_guard.supervise.events import ChildExited, ChildLine, HealthResult

PACKS = load_default_packs()
MATCHER = Matcher(PACKS)
OPTIONS = load_option_table()
TS = "[2026-11-29 16:50:40]"


@pytest.mark.parametrize("text", FATAL_TEXTS)
def test_the_fatal_line_itself_is_caught(text: str) -> None:
    assert any(r.fatal for r in MATCHER.candidates(clean(text.encode(), 65536))), text


@pytest.mark.parametrize("text", FATAL_TEXTS)
def test_no_rule_reads_a_request_an_access_line_or_a_quoted_string(text: str) -> None:
    for line in quoting(text):
        hits = [r.id for r in MATCHER.candidates(clean(line.encode(), 65536)) if r.fatal]
        assert hits == [], f"{line!r} triggered {hits}"


@pytest.mark.parametrize(("line", "want"), [
    ("ValueError: x", ("ValueError: x", False)),
    ("torch.OutOfMemoryError: CUDA out of memory.", ("torch.OutOfMemoryError: CUDA out of memory.",
                                                     False)),
    ("[2026-11-29 16:50:37] ERROR:    [Errno 98] busy", ("[Errno 98] busy", False)),
    ("[2026-11-29 16:50:00 TP0] Scheduler hit an exception: X", ("Scheduler hit an exception: X",
                                                                True)),
    ("sglang serve: error: argument --kv-cache-dtype: invalid choice: 'x'",
     ("error: argument --kv-cache-dtype: invalid choice: 'x'", False)),
    ("WARNING: deprecated flag", None),  # a level name, not an exception class
    ("  File \"x.py\", line 3, in f", None),  # traceback body
    ("    raise ValueError(", None),
    ("Traceback (most recent call last):", None),
    ("/venv/sglang/launch_server.py:71: UserWarning: 'python -m ...' is still supported", None),
    ("Loading safetensors checkpoint shards:  50% Completed | 1/2", None),
    ("", None),
])
def test_error_text_classifies_lines(line: str, want: tuple[str, bool] | None) -> None:
    assert error_text(line) == want


def test_a_plain_record_matches_only_from_its_message_start() -> None:
    crash = "Scheduler hit an exception: Traceback (most recent call last):"
    assert [r.id for r in MATCHER.candidates(f"{TS} {crash}")] == ["scheduler-crash"]
    assert MATCHER.candidates(f"{TS} note: {crash}") == ()
    assert MATCHER.candidates(crash) == ()  # not SGLang's format: no record, no exception


# --- the machine: a ready server that logs such requests is left alone ----------------------


def _env() -> machine.Env:
    return machine.Env(options=OPTIONS, matcher=MATCHER, restart=RestartSection(),
                       health=HealthSection(), arch="unknown", sm=None, sglang_version=None,
                       derived_dir="/tmp/derived")


def _ready(env: machine.Env, argv: tuple[str, ...]) -> machine.State:
    state, _ = machine.start(machine.State(cl=parse_command_line(argv, OPTIONS)), env)
    state, _ = machine.step(state, ChildLine(1, "stderr", machine.READY_LINE, 1), env, 1.0, 0.5)
    state, _ = machine.step(state, HealthResult(1, "/health", True, "200"), env, 2.0, 0.5)
    assert state.phase == "ready"
    return state


# Every flag a default rule may change is on the command line, so a match would have work.
ARGV = ("--model-path", "/m", "--port", "30000", "--attention-backend", "fa3",
        "--decode-attention-backend", "trtllm_mla", "--prefill-attention-backend", "trtllm_mha",
        "--kv-cache-dtype", "fp8_e5m2", "--mem-fraction-static", "0.85", "--log-requests")


def test_a_ready_server_logging_every_pattern_in_requests_is_never_touched() -> None:
    env = _env()
    state = _ready(env, ARGV)
    now = 3.0
    for text in FATAL_TEXTS:
        for line in quoting(text):
            now += 0.01
            state, actions = machine.step(state, ChildLine(1, "stderr", line, len(line)), env,
                                          now, 0.5)
            assert actions == [], f"{line!r} -> {actions}"
    assert state.phase == "ready" and state.fired == {}


def test_after_ready_a_start_phase_rule_does_not_act_but_running_rules_do() -> None:
    env = _env()
    state = _ready(env, ARGV)
    fa3 = "AssertionError: FlashAttention v3 Backend requires SM>=80 and SM<=90."
    state, actions = machine.step(state, ChildLine(1, "stderr", fa3, 1), env, 3.0, 0.5)
    assert actions == []  # a start-up rule: after ready it is no fix
    crash = f"{TS} Scheduler hit an exception: Traceback (most recent call last):"
    state, actions = machine.step(state, ChildLine(1, "stderr", crash, 1), env, 3.0, 0.5)
    assert [a.name for a in actions if hasattr(a, "name")] == ["settle"]  # phase = "any"


def test_before_ready_the_same_start_rule_acts() -> None:
    env = _env()
    state, _ = machine.start(machine.State(cl=parse_command_line(ARGV, OPTIONS)), env)
    fa3 = "AssertionError: FlashAttention v3 Backend requires SM>=80 and SM<=90."
    state, actions = machine.step(state, ChildLine(1, "stderr", fa3, 1), env, 3.0, 0.5)
    assert [a for a in actions if isinstance(a, Stop)] == [Stop(1, "rule fa3-requires-sm80-sm90")]


# --- environment failures -----------------------------------------------------------------


@pytest.mark.parametrize(("line", "rule", "names"), ENV_LINES)
def test_environment_line_gives_a_diagnosis_naming_the_library(line: str, rule: str,
                                                             names: list[str]) -> None:
    ctx = MatchContext({}, "unknown", None, None)
    fix, _ = first_fix(MATCHER, line, ctx, {})
    assert fix is not None and fix.rule.id == rule and fix.action == "environment"
    for name in names:
        assert name in fix.diagnosis, fix.diagnosis
    assert "?" not in fix.diagnosis and "{" not in fix.diagnosis


@pytest.mark.parametrize(("line", "rule", "names"), ENV_LINES)
def test_environment_failure_is_one_launch_and_exit_69(line: str, rule: str,
                                                      names: list[str]) -> None:
    env = _env()
    state, actions = machine.start(machine.State(cl=parse_command_line(ARGV, OPTIONS)), env)
    crash = f"{TS} Scheduler hit an exception: Traceback (most recent call last):"
    state, actions = machine.step(state, ChildLine(1, "stderr", crash, 1), env, 1.0, 0.5)
    state, actions = machine.step(state, ChildLine(1, "stderr", line, 1), env, 1.1, 0.5)
    planned = [a.record.to_record() for a in actions if isinstance(a, Journal)]
    assert planned[0]["event"] == "give_up.planned" and planned[0]["class"] == "environment"
    assert planned[0]["rule"] == rule
    state, actions = machine.step(state, ChildExited(1, 42, 1), env, 1.2, 0.5)
    exits = [a for a in actions if isinstance(a, Exit)]
    assert [e.code for e in exits] == [EXIT_ENVIRONMENT]
    assert not [a for a in actions if isinstance(a, Spawn)]
    assert all(n in exits[0].reason for n in names)
    assert state.phase == "done" and state.gen == 1


@pytest.mark.parametrize("text", FATAL_TEXTS)
def test_the_prefilter_passes_every_fatal_line_and_skips_requests(text: str) -> None:
    """The per-line scan is a superset of the matcher, and near-miss lines reach no rule."""
    assert MATCHER.scan(clean(text.encode(), 65536).encode() + b"\n").rule, text
    for line in quoting(text)[:7]:  # requests, the OpenAI record, access lines
        assert not any(r.fatal for r in MATCHER.candidates(line)), line


def test_explain_names_the_library_and_skips_the_request(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    log.write_text(f"{TS} Receive: obj=GenerateReqInput(rid='x', text={ENV_LINES[2][0]!r})\n"
                   "Traceback (most recent call last):\n"
                   '  File "/venv/lib/python3.11/site-packages/sgl_kernel/__init__.py", line 5\n'
                   f"{ENV_LINES[2][0]}\n", encoding="utf-8")
    (match,) = explain_log(str(log), GuardConfig())
    assert match.line_no == 4 and match.rule.id == "env-cuda-library-missing"
    assert "libnvrtc.so.12" in match.why and "exit 69" in match.render()
