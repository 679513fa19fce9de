"""Issue 20: one reading of SGLang's output. What `explain` finds, the machine acts on, on the
same bytes: every line SGLang's processes print is read (records or not, after blank lines),
request text stays inert by structure, and the RE2 fallback matches what Hyperscan matches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from requestlines import FATAL_TEXTS, MESSAGES, quoting
from sglang_guard.common.outcomes import FixKind
from sglang_guard.config.guardconfig import GuardConfig, HealthSection, RestartSection
from sglang_guard.rules import tracebacks as tb
from sglang_guard.rules.blockscan import BlockScan
from sglang_guard.rules.fixes import Scale
from sglang_guard.rules.linereader import LineReader
from sglang_guard.rules.logline import LINE_CAP, clean
from sglang_guard.rules.rules import MatchContext, Matcher, load_default_packs, plan_fix
from sglang_guard.rules.shell.explain import explain_fix, explain_lines
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.releases import load_option_table
from sglang_guard.supervise import machine
from sglang_guard.supervise.actions import Exit, Journal, Spawn
from sglang_guard.supervise.events import ChildExited, ChildLine, Tick

PACKS = load_default_packs()
MATCHER = Matcher(PACKS)
OPTIONS = load_option_table()
TS = "[2026-11-29 16:50:40"
START = [
    f"{TS}] server_args=ServerArgs(model_path='/m', tp_size=2)",
    f"{TS} TP0] Init torch distributed begin.",
    f"{TS} TP1] Init torch distributed begin.",
]
CUSTOM_AR = ("Failed: Cuda error /sgl-workspace/sglang/sgl-kernel/csrc/allreduce/"
             "custom_all_reduce.cuh:307 'peer access is not supported between these two devices'")
KV = [
    f"{TS} TP0] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/venv/sglang/srt/managers/scheduler.py", line 3000, in run_scheduler_process',
    "    scheduler = Scheduler(server_args)",
    "ValueError: Loaded weights leave no GPU memory for the KV cache under "
    "--mem-fraction-static=0.88.",
    "",
    f"{TS}] Received sigquit from a child process. It usually means the child failed.",
]
FA3 = "ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90."


def _env() -> machine.Env:
    return machine.Env(options=OPTIONS, matcher=MATCHER, restart=RestartSection(),
                       health=HealthSection(), arch="unknown", sm=None, sglang_version="0.5.23",
                       derived_dir="/tmp/derived")


def live(lines: Sequence[str], argv: tuple[str, ...]) -> list[dict[str, object]]:
    """The journal records the machine writes for these lines, read as the reader reads them."""
    env = _env()
    state, _ = machine.start(machine.State(cl=parse_command_line(argv, OPTIONS)), env)
    read, records, now = tb.UNKNOWN, [], 1.0
    for text in lines:
        read, ends = tb.step(read, text)
        state, actions = machine.step(state, ChildLine(1, "stderr", text, len(text), ends), env,
                                      now, 0.5)
        records += [a.record.to_record() for a in actions if isinstance(a, Journal)]
        now += 0.01
    return records


def _fixed(records: list[dict[str, object]]) -> list[tuple[object, object, object]]:
    return [(r["rule"], r["flag"], r["new_value"]) for r in records if r["event"] == "remediated"]


BASE = ("--model-path", "/m", "--tp-size", "2")


def test_kv_budget_without_the_flag_is_raised_on_the_first_failure() -> None:
    assert _fixed(live(KV, BASE)) == [("kv-no-memory-raise", "--mem-fraction-static", "0.95")]


def test_custom_all_reduce_line_after_start_up_records_sets_the_flag() -> None:
    records = live([*START, CUSTOM_AR], BASE)
    assert _fixed(records) == [("custom-all-reduce-no-p2p", "--disable-custom-all-reduce", None)]
    fix = explain_fix([*START, CUSTOM_AR], GuardConfig(), list(BASE))
    assert fix is not None and fix.flag == "--disable-custom-all-reduce"


@pytest.mark.parametrize("fatal", [FA3, CUSTOM_AR])
def test_a_blank_line_before_a_fatal_line_changes_nothing(fatal: str) -> None:
    argv = (*BASE, "--attention-backend", "fa3")
    want = _fixed(live([fatal], argv))
    assert want
    for before in ([""], [*START, ""], ["", "", *START, "  ", ""]):
        assert _fixed(live([*before, fatal], argv)) == want, before
        matches = explain_lines([*before, fatal], GuardConfig(), MATCHER)
        assert [m.rule.id for m in matches][:1] == [want[0][0]], before


def test_request_text_after_records_still_acts_on_nothing() -> None:
    """Requests quoting every fatal message, after start-up records and blank lines."""
    lines = [*START, ""]
    for text in FATAL_TEXTS:
        lines += quoting(text)
    assert _fixed(live(lines, (*BASE, "--log-requests"))) == []


@pytest.mark.parametrize("raw", [
    b"Failed: Cuda error \xff/x/custom_all_reduce.cuh:307 'peer access is not supported "
    b"between these two devices'\n",
    b"\xffFailed: Cuda error /x/custom_all_reduce.cuh:307 'peer access is not supported "
    b"between these two devices'\n",
    b"RuntimeError: \xc3 peer access is not supported between these two devices\n",
])
def test_the_re2_path_matches_a_fatal_line_with_an_invalid_utf8_byte(raw: bytes) -> None:
    exact = BlockScan(MATCHER._lines.patterns, accelerate=False)
    rule = next(i for i, r in enumerate(MATCHER.rules) if r.id == "custom-all-reduce-no-p2p")
    assert rule in exact.hits(raw)
    line = clean(raw, 65536)
    assert "custom-all-reduce-no-p2p" in [r.id for r in MATCHER.candidates(line, True)]
    assert _fixed(live([*START, line], BASE))


# --- issue 19 item 6: a crash that recurs is not retried blindly ---------------------------

CRASH = [f"{TS} TP0] Scheduler hit an exception: Traceback (most recent call last):",
         '  File "/venv/sglang/srt/managers/scheduler.py", line 3000, in event_loop',
         "RuntimeError: CUDA error: an illegal memory access was encountered at 0x7f3a2c00 "
         "(rank 1, 4096 bytes)"]


def _as_read(lines: list[str], gen: int) -> tuple[list[ChildLine], str | None]:
    """What the live reader hands the machine for this output (rules/linereader.py with the
    default pack's scan and exact filter, as the supervisor reads): the lines a rule reads,
    and the last exception line, which the exit event carries."""
    reader = LineReader(LINE_CAP, lambda block: MATCHER.line_scan(block, True),
                        lambda ln: bool(MATCHER.candidates(ln.text, ln.ends)))
    data = "".join(f"{text}\n" for text in lines).encode()
    got = reader.feed(data) + reader.close()
    return ([ChildLine(gen, "stderr", ln.text, ln.length, ln.ends, ln.exception) for ln in got],
            reader.last_exception)


def _launches(outputs: list[list[str]], restart: RestartSection, via: str = "lines"
              ) -> tuple[list[dict[str, object]], list[Exit], int]:
    """Each launch prints its lines and exits 1: the journal, the Exit actions, launches.

    `via`: "lines", every line is an event (a replay); "reader", the live reader's events and
    exit (only the lines a rule reads; the exit carries the last exception line)."""
    env = replace(_env(), restart=restart)
    state, actions = machine.start(machine.State(cl=parse_command_line(BASE, OPTIONS)), env)
    records: list[dict[str, object]] = []
    exits: list[Exit] = []
    spawns, now = 1, 1.0
    for i, lines in enumerate(outputs):
        read, events, last = tb.UNKNOWN, [], None
        if via == "reader":
            events, last = _as_read(lines, state.gen)
        for text in lines if via == "lines" else ():
            before = read
            read, ends = tb.step(read, text)
            events.append(ChildLine(state.gen, "stderr", text, 1, ends,
                                    tb.ends_frames(before, read)))
        for line in events:
            state, actions = machine.step(state, line, env, now, 0.5)
            records += [a.record.to_record() for a in actions if isinstance(a, Journal)]
        for name in ("settle",):
            state, actions = machine.step(state, Tick(name, state.gen), env, now + 3, 0.5)
            records += [a.record.to_record() for a in actions if isinstance(a, Journal)]
        state, actions = machine.step(state, ChildExited(state.gen, 100 + i, 1, last), env,
                                      now + 4, 0.5)
        records += [a.record.to_record() for a in actions if isinstance(a, Journal)]
        exits += [a for a in actions if isinstance(a, Exit)]
        if exits:
            break
        state, actions = machine.step(state, Tick("backoff", state.gen), env, now + 10, 0.5)
        spawns += sum(isinstance(a, Spawn) for a in actions)
        now += 20
    return records, exits, spawns


@pytest.mark.parametrize("via", ["lines", "reader"])
def test_two_identical_crash_lines_end_the_guard_with_that_line(via: str) -> None:
    other = [CRASH[0], CRASH[1], CRASH[2].replace("0x7f3a2c00", "0x55d1e8").replace("4096", "8")]
    records, exits, spawns = _launches([CRASH, other, CRASH], RestartSection(max_failures=9),
                                       via)
    assert spawns == 2  # never a third identical launch
    (done,) = exits
    assert done.code == 75 and "illegal memory access" in done.reason
    give_up = next(r for r in records if r["event"] == "give_up")
    assert give_up["line"] == other[2]
    assert give_up["cause"] == "repeated_crash"  # its own label, not `other` (issue 21)


@pytest.mark.parametrize("via", ["lines", "reader"])
def test_different_crash_lines_are_retried_and_the_repeat_check_can_be_turned_off(via: str
                                                                                  ) -> None:
    second = [*CRASH[:2], "RuntimeError: NCCL error: unhandled system error"]
    _, exits, spawns = _launches([CRASH, second, CRASH], RestartSection(max_failures=3), via)
    assert spawns == 3 and "crash loop" in exits[0].reason
    _, exits, spawns = _launches([CRASH] * 3, RestartSection(max_failures=3,
                                                             give_up_on_repeat=False), via)
    assert spawns == 3 and "crash loop" in exits[0].reason


@pytest.mark.parametrize("via", ["lines", "reader"])
def test_only_the_line_that_ends_a_traceback_counts_as_the_crash(via: str) -> None:
    """A plain line read outside any traceback ("Warning: ...") is no crash's line."""
    plain = [f"{TS}] Init torch distributed begin.", "Warning: NCCL_P2P_DISABLE is set"]
    _, exits, spawns = _launches([plain] * 3, RestartSection(max_failures=3), via)
    assert spawns == 3 and "crash loop" in exits[0].reason


# --- item 4: a set_flag rule with a default acts when the flag is absent --------------------

_DEFAULTED = {r.id: r for r in MATCHER.rules if r.action == FixKind.SET_FLAG
              and isinstance(r.new_value, Scale) and r.new_value.default is not None}
MESSAGE_LINES = [(m["rule"], m["text"]) for m in MESSAGES if m["rule"] in _DEFAULTED]


@pytest.mark.parametrize(("rule_id", "text"), MESSAGE_LINES)
def test_a_rule_with_a_default_acts_when_its_flag_is_absent(rule_id: str, text: str) -> None:
    rule = _DEFAULTED[rule_id]
    line = clean(text.encode(), 65536)
    fix = plan_fix(rule, MatchContext({}, "unknown", None, None, OPTIONS), line)
    assert fix is not None and fix.flag in rule.flags and fix.new_value is not None, line
