"""The real supervisor with the shipped packs and a fake child (issue 12, items 4-6):
requests quoting every fatal pattern after ready, an environment failure, a start hang."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from requestlines import ENV_LINES, FATAL_TEXTS, TS, quoting
from sglang_guard.config.guardconfig import StartSection
from sglang_guard.errors import EXIT_ENVIRONMENT, EXIT_GIVE_UP, EXIT_OK
from sglang_guard.rules.logline import is_exception_line
from sglang_guard.rules.rules import Matcher, load_default_packs
from sglang_guard.supervise import machine
from sglang_guard.supervise.events import SignalReceived
from sglang_guard.supervise.shell.supervisor import Runtime, Supervisor
from support.harness import (
    HealthServer,
    Launcher,
    base_argv,
    count,
    journal_events,
    make_runtime,
    ready_then_wait,
    supervise,
    terminate_when,
    wait_for,
)
from support.pack import FA3_LINE

ARGV_FLAGS = ("--attention-backend", "fa3", "--kv-cache-dtype", "fp8_e5m2",
              "--mem-fraction-static", "0.85", "--log-requests")


def _default_packs(rt: Runtime) -> None:
    rt.env = replace(rt.env, matcher=Matcher(load_default_packs()))


def _left_alone(tmp_path: Path, script: list[list[object]], *waits: Callable[[], bool]) -> None:
    """Run `script` with the shipped packs until ready (and `waits`), then 2.5 s more, past
    the settle window: one launch, exit 0, and no remediation, crash, give-up or backoff."""
    launcher = Launcher(tmp_path, [script])
    state = tmp_path / "state"
    with HealthServer() as server:
        rt = make_runtime(tmp_path, launcher)
        _default_packs(rt)

        def during(sup: Supervisor) -> None:
            wait_for(lambda: count(state, "ready") >= 1, 60, "ready")
            for done in waits:
                wait_for(done, 60, "the fake child's last line")
            time.sleep(2.5)  # longer than the settle window: a late decision would show
            sup.events.put(SignalReceived(signal.SIGTERM))

        code = supervise(rt, base_argv(server.port, *ARGV_FLAGS), during)
    assert code == EXIT_OK
    events = [r["event"] for r in journal_events(state)]
    assert events.count("child.start") == 1, events
    for bad in ("remediated", "crash.detected", "give_up.planned", "give_up", "restored",
                "backoff"):
        assert bad not in events, (bad, events)


def test_ready_server_logging_requests_that_quote_every_pattern_is_left_alone(
        tmp_path: Path) -> None:
    lines = [line for text in FATAL_TEXTS for line in quoting(text)]
    done = tmp_path / "done"
    script = [["print", "stdout", f"{TS} {machine.READY_LINE}"],
              *[["print", "stderr", line] for line in lines],
              ["print", "stdout", f"{TS} all requests logged"], ["pidfile", str(done)],
              ["wait_term"], ["exit", 0]]
    _left_alone(tmp_path, script, done.exists)
    assert done.exists(), "the fake child did not log every request"
    assert len(lines) > 500


def test_an_exception_message_that_quotes_fatal_lines_on_its_own_lines_is_left_alone(
        tmp_path: Path) -> None:
    """While starting: the lines after an exception line are its message, not new errors."""
    quoted = [t for t in FATAL_TEXTS if is_exception_line(t) and not t.startswith("- ")]
    done = tmp_path / "done"
    script = [["print", "stderr", f"{TS} Init torch distributed begin."],
              ["print", "stderr", "Traceback (most recent call last):"],
              ["print", "stderr", '  File "sglang/srt/utils/common.py", line 120, in probe'],
              ["print", "stderr", "ImportError: optional kernel not loaded; its build log says:"],
              *[["print", "stderr", text] for text in quoted],
              ["print", "stderr", ""],
              ["print", "stdout", f"{TS} {machine.READY_LINE}"], ["pidfile", str(done)],
              ["wait_term"], ["exit", 0]]
    _left_alone(tmp_path, script, done.exists)
    assert len(quoted) > 50


def test_a_traceback_read_over_many_chunks_still_ends_in_its_exception_line(
        tmp_path: Path) -> None:
    """Header, frames, another rank's record and the exception line arrive in separate reads:
    the frames' chunk is skipped by the prefilter, and the state carries over."""
    pause = ["sleep", 0.3]  # each print reaches the reader as a read of its own
    script = [["print", "stderr", f"{TS} Load weight end. type=LlamaForCausalLM"], pause,
              ["print", "stderr", f"{TS} Scheduler hit an exception: Traceback (most recent "
                                  "call last):"], pause,
              ["print", "stderr", '  File "sglang/srt/layers/attention/attention_registry.py"'
                                  ", line 244, in create_flashattention_v3_backend"], pause,
              ["print", "stderr", "[2026-11-29 16:50:40 TP1] Load weight end."], pause,
              ["print", "stderr", FA3_LINE], ["exit", 1]]
    launcher = Launcher(tmp_path, [script, ready_then_wait()])
    with HealthServer() as server:
        rt = make_runtime(tmp_path, launcher)
        _default_packs(rt)
        argv = base_argv(server.port, "--attention-backend", "fa3")
        code = supervise(rt, argv, terminate_when(tmp_path / "state", "ready"))
    assert code == EXIT_OK
    first, second = launcher.argvs()
    assert "fa3" in first and "fa3" not in second


def test_environment_failure_one_launch_exit_69_no_restart(tmp_path: Path) -> None:
    line, rule, names = ENV_LINES[0]
    script = [["print", "stderr", f"{TS} Scheduler hit an exception: Traceback (most recent "
                                  "call last):"],
              ["print", "stderr", '  File "sgl_kernel/__init__.py", line 13, in <module>'],
              ["print", "stderr", line], ["wait_term"], ["exit", 1]]
    launcher = Launcher(tmp_path, [script])
    rt = make_runtime(tmp_path, launcher, max_failures=5)
    _default_packs(rt)
    code = supervise(rt, base_argv(1))
    assert code == EXIT_ENVIRONMENT
    assert len(launcher.argvs()) == 1
    records = journal_events(tmp_path / "state")
    planned = [r for r in records if r["event"] == "give_up.planned"]
    assert [(r["rule"], r["class"]) for r in planned] == [(rule, "environment")]
    assert all(n in planned[0]["reason"] for n in names)
    assert [r["code"] for r in records if r["event"] == "guard.exit"] == [EXIT_ENVIRONMENT]


def test_silent_distributed_init_is_reported_and_given_up(tmp_path: Path) -> None:
    script = [["print", "stderr", f"{TS} server_args=ServerArgs(nnodes=2, node_rank=0)"],
              ["print", "stderr", f"{TS} Init parallel begin."],
              ["print", "stderr", f"{TS} init_cpu_threads_env and shared memory based "
                                  "AllReduce is disabled"],
              ["pause"]]
    launcher = Launcher(tmp_path, [script])
    rt = make_runtime(tmp_path, launcher, max_failures=5, stop_grace_s=1.0)
    _default_packs(rt)
    rt.env = replace(rt.env, start=StartSection(init_s=30.0, dist_init_s=1.5,
                                                on_stall="give_up"))
    started = time.monotonic()
    code = supervise(rt, base_argv(1))
    took = time.monotonic() - started
    assert code == EXIT_GIVE_UP
    assert took < 20, took
    records = journal_events(tmp_path / "state")
    assert [r["stage"] for r in records if r["event"] == "start.stage"] == ["dist_init"]
    (stalled,) = [r for r in records if r["event"] == "start.stalled"]
    assert stalled["stage"] == "dist_init"
    assert "AllReduce is disabled" in stalled["line"]
    assert count(tmp_path / "state", "child.start") == 1


def test_a_progress_bar_redrawn_in_place_counts_as_progress(tmp_path: Path) -> None:
    """tqdm redraws with a carriage return, no newline: progress (3 s > the 1.5 s limit)."""
    bar = "\rLoading safetensors checkpoint shards:  {}% Completed | {}/6".format
    script = [["print", "stderr", f"{TS} Load weight begin. avail mem=20.83 GB"],
              *[step for i in range(1, 7)
                for step in (["hex", "stderr", bar(i * 100 // 6, i).encode().hex()],
                             ["sleep", 0.5])],
              ["print", "stderr", ""], ["print", "stdout", machine.READY_LINE],
              ["wait_term"], ["exit", 0]]
    launcher = Launcher(tmp_path, [script])
    with HealthServer() as server:
        rt = make_runtime(tmp_path, launcher)
        _default_packs(rt)
        rt.env = replace(rt.env, start=StartSection(init_s=30.0, weights_s=1.5,
                                                    on_stall="give_up"))
        state = tmp_path / "state"

        def during(sup: Supervisor) -> None:
            wait_for(lambda: count(state, "ready") >= 1, 30, "ready")
            sup.events.put(SignalReceived(signal.SIGTERM))

        code = supervise(rt, base_argv(server.port), during)
    assert code == EXIT_OK
    records = journal_events(state)
    assert [r["stage"] for r in records if r["event"] == "start.stage"] == ["weights"]
    assert not [r for r in records if r["event"] == "start.stalled"]
