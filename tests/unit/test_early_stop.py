"""Issue 24: a reader's early stop stops the child exactly where the loop's steps would.

supervise/machine.stops_at, asked of a run of lines from a state, against machine.step
stepping the same lines from the same state with nothing between them (what the queue's
lock guarantees: supervise/shell/eventqueue.py): over every stored log (tests/data/
sglang-logs, realworld) as the reader reads it (the lines the supervisor keeps, with their
traceback flags) and line by line, from every state a replay of it passes through; in the
starting and the ready phase; with each rule's fires left, one left and none left; at GPU
generations and releases the rules' conditions name; and over random soups of those lines,
request lines quoting every fatal message and SGLang's ready line. A run holding the ready
line may answer False where the steps stop (the ready phase may begin): never the other way.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from requestlines import FATAL_TEXTS, quoting
from sglang_guard.config.guardconfig import HealthSection
from sglang_guard.rules import tracebacks
from sglang_guard.rules.rules import Matcher, load_default_packs
from sglang_guard.rules.stages import READY_LINE
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.releases import load_option_table
from sglang_guard.supervise import machine
from sglang_guard.supervise.actions import Stop
from sglang_guard.supervise.events import ChildLine
from sglang_guard.supervise.replay import env_for
from support.storedlogs import STORED, reader

MATCHER = Matcher(load_default_packs())
MATCHER.prepare_scan()
OPTIONS = load_option_table()
WINDOW = 3  # lines asked about at once (a chunk's lines come as one batch)
# (sm, release): unknown, and the generations and releases the pack's conditions name
FACTS = [(None, None), (80, "0.5.17"), (90, "0.5.23"), (100, "0.5.23"), (120, "0.4.6")]


def steps_stop(state: machine.State, env: machine.Env, lines: Sequence[ChildLine]) -> bool:
    """Whether stepping `lines` in order from `state` puts out a Stop."""
    for line in lines:
        state, actions = machine.step(state, line, env, 1.0, 0.5)
        if any(isinstance(action, Stop) for action in actions):
            return True
    return False


def agree(state: machine.State, env: machine.Env, lines: Sequence[ChildLine]) -> None:
    early = machine.stops_at(state, env, lines)
    stepped = steps_stop(state, env, lines)
    if any(READY_LINE in line.text for line in lines):
        assert not early or stepped, [line.text for line in lines]
    else:
        assert early == stepped, (state.phase, dict(state.fired), [line.text for line in lines])


def as_events(texts: Sequence[str]) -> list[ChildLine]:
    """Lines as a per-line pass reads them (every line, its traceback flags)."""
    read, out = tracebacks.UNKNOWN, []
    for text in texts:
        before = read
        read, ends = tracebacks.step(before, text)
        out.append(ChildLine(1, "stderr", text, len(text), ends,
                             tracebacks.ends_frames(before, read)))
    return out


def kept(raw: bytes) -> list[ChildLine]:
    """The lines the supervisor's reader puts on the queue for these bytes."""
    lines = reader(MATCHER)
    got = lines.feed(raw) + lines.close()
    return [ChildLine(1, "stderr", ln.text, ln.length, ln.ends, ln.exception) for ln in got]


def states(env: machine.Env, argv: Sequence[str]) -> list[machine.State]:
    """A launch of `argv` starting, and ready; each with the pack's fires as they come, one
    fire left and none left."""
    start, _ = machine.start(machine.State(cl=parse_command_line(list(argv), OPTIONS)), env)
    ready = replace(start, phase="ready", ready_line=True, last_ready=start.cl)
    out = []
    for base in (start, ready):
        out += [base,
                replace(base, fired={r.id: max(0, r.max_fires - 1) for r in MATCHER.rules}),
                replace(base, fired={r.id: r.max_fires for r in MATCHER.rules})]
    return out


def walk(state: machine.State, env: machine.Env, lines: Sequence[ChildLine]) -> int:
    """Ask at every line of a replay from `state`, then step it; how many runs were asked."""
    asked = 0
    for i in range(len(lines)):
        for width in range(1, WINDOW + 1):
            if i + width <= len(lines):
                agree(state, env, lines[i:i + width])
                asked += 1
        state, actions = machine.step(state, lines[i], env, 1.0 + i, 0.5)
        if any(isinstance(action, Stop) for action in actions):
            state = replace(state, phase="starting", pending=None)  # and read on, as relaunched
    return asked


@pytest.mark.parametrize("name", sorted(STORED))
def test_the_early_stop_decides_what_the_steps_decide_on_a_stored_log(name: str) -> None:
    raw, argv, _ = STORED[name]
    sm, release = FACTS[sum(map(ord, name)) % len(FACTS)]
    env = env_for(MATCHER, OPTIONS, sm=sm, sglang_version=release)
    texts = raw.decode("utf-8", "replace").splitlines()
    asked = 0
    for state in states(env, argv):
        asked += walk(state, env, kept(raw))
        asked += walk(state, env, as_events(texts[-40:]))  # every line of its tail
    assert asked > 0


def test_a_fatal_line_the_loop_would_fix_is_stopped_early_and_a_worker_never_is() -> None:
    """The idle case the bench measures (bench/compare/floodchild.py): the crash banner (a
    catch-all), a frame, the fa3 line with fa3 on the command line."""
    env = env_for(MATCHER, OPTIONS, sm=None, sglang_version="0.5.23")
    lines = as_events([
        "[2026-01-01 00:00:00] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "scheduler.py", line 1, in run_scheduler_process',
        "ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90. "
        "Please use `--attention-backend flashinfer`."])
    start, = states(env, ["--model-path", "/m", "--attention-backend", "fa3"])[:1]
    assert machine.stops_at(start, env, lines) and steps_stop(start, env, lines)
    assert not machine.stops_at(start, env, lines[:2])  # the banner alone waits to settle
    assert not steps_stop(start, env, lines[:2])
    without, = states(env, ["--model-path", "/m"])[:1]  # nothing to drop: a catch-all waits
    assert not machine.stops_at(without, env, lines)
    assert not steps_stop(without, env, lines)
    assert not machine.stops_at(start, replace(env, role="worker"), lines)
    assert not machine.stops_at(replace(start, phase="stopping"), env, lines)


@pytest.mark.parametrize("seed", range(6))
def test_random_soups_of_stored_lines_decide_alike(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    pool = [text for raw, _, _ in STORED.values()
            for text in raw.decode("utf-8", "replace").splitlines()]
    extra = [line for text in rng.sample(FATAL_TEXTS, min(6, len(FATAL_TEXTS)))
             for line in quoting(text)]
    texts = [*rng.sample(pool, 120), *extra, READY_LINE]
    rng.shuffle(texts)
    names = sorted(STORED)
    _, argv, _ = STORED[names[seed % len(names)]]
    sm, release = FACTS[seed % len(FACTS)]
    env = env_for(MATCHER, OPTIONS, sm=sm, sglang_version=release)
    for probed in (env, replace(env, health=HealthSection(enabled=False))):
        for state in states(probed, argv)[::2]:
            assert walk(state, probed, as_events(texts)) > 0


def test_the_ready_line_before_a_start_up_fix_is_no_early_stop() -> None:
    """Without health probes the ready line starts the ready phase at once, where a rule of
    the start no longer acts: the steps do not stop, and neither does the early stop."""
    env = replace(env_for(MATCHER, OPTIONS, sglang_version="0.5.23"),
                  health=HealthSection(enabled=False))
    start, = states(env, ["--model-path", "/m", "--attention-backend", "fa3"])[:1]
    fa3 = as_events(["ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90."])
    ready = as_events([f"[2026-01-01 00:00:00] {READY_LINE}"])
    assert machine.stops_at(start, env, fa3) and steps_stop(start, env, fa3)
    assert not steps_stop(start, env, [*ready, *fa3])
    assert not machine.stops_at(start, env, [*ready, *fa3])
