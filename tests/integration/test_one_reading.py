"""Issue 20, live: the running guard reads SGLang's output as `explain` does (default packs,
real reader threads, a fake SGLang printing real lines)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from sglang_guard.rules.rules import Matcher, load_default_packs
from sglang_guard.supervise.shell.supervisor import Runtime
from support.harness import Launcher, base_argv, journal_events, make_runtime, supervise
from support.procs import free_port

TS = "[2026-11-29 16:50:40"
START = [f"{TS}] server_args=ServerArgs(model_path='/models/fake', tp_size=2)",
         f"{TS} TP0] Init torch distributed begin.", f"{TS} TP1] Init torch distributed begin."]
HEADER = f"{TS} TP0] Scheduler hit an exception: Traceback (most recent call last):"
FRAMES = ['  File "/venv/sglang/srt/managers/scheduler.py", line 3000, in run_scheduler_process',
          "    scheduler = Scheduler(server_args)"]
KV_LINE = ("ValueError: Loaded weights leave no GPU memory for the KV cache under "
           "--mem-fraction-static=0.88.")
SIGQUIT = f"{TS}] Received sigquit from a child process. It usually means the child failed."
CUSTOM_AR = ("Failed: Cuda error /sgl-workspace/sgl-kernel/csrc/allreduce/custom_all_reduce.cuh:307"
             " 'peer access is not supported between these two devices'")


def _default_runtime(tmp: Path, launcher: Launcher, **restart: Any) -> Runtime:
    rt = make_runtime(tmp, launcher, **restart)
    return replace(rt, env=replace(rt.env, matcher=Matcher(load_default_packs()),
                                   sglang_version="0.5.23"))


def _prints(lines: list[str]) -> list[list[Any]]:
    return [["print", "stderr", line] for line in lines]


def _remediated(tmp: Path) -> list[tuple[Any, Any, Any]]:
    return [(r["rule"], r["flag"], r["new_value"]) for r in journal_events(tmp / "state")
            if r["event"] == "remediated"]


def test_kv_budget_traceback_without_the_flag_is_fixed_on_the_first_failure(
        tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, [
        [*_prints([*START, HEADER, *FRAMES, KV_LINE, "", SIGQUIT]), ["wait_term"], ["exit", 1]],
        [["exit", 1]]])
    supervise(_default_runtime(tmp_path, launcher), base_argv(free_port()))
    assert _remediated(tmp_path) == [("kv-no-memory-raise", "--mem-fraction-static", "0.95")]
    assert launcher.argvs()[1][-2:] == ["--mem-fraction-static", "0.95"]
    assert not any(r["event"] == "crash.detected" for r in journal_events(tmp_path / "state"))


def test_custom_all_reduce_line_after_start_up_records_sets_the_flag(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, [
        [*_prints([*START, CUSTOM_AR]), ["wait_term"], ["exit", 1]], [["exit", 1]]])
    supervise(_default_runtime(tmp_path, launcher), base_argv(free_port(), "--tp-size", "2"))
    assert _remediated(tmp_path) == [("custom-all-reduce-no-p2p", "--disable-custom-all-reduce",
                                      None)]


def test_a_traceback_then_silence_is_decided_by_its_exception_line(tmp_path: Path) -> None:
    """No next line, no exit: the exception line decides, before the catch-all's settle."""
    launcher = Launcher(tmp_path, [
        [*_prints([*START, HEADER, *FRAMES, KV_LINE]), ["wait_term"], ["exit", 1]],
        [["exit", 1]]])
    supervise(_default_runtime(tmp_path, launcher), base_argv(free_port()))
    records = journal_events(tmp_path / "state")
    assert _remediated(tmp_path) == [("kv-no-memory-raise", "--mem-fraction-static", "0.95")]
    assert not any(r["event"] == "crash.detected" for r in records)
    # The child was stopped (it never exits by itself before SIGTERM): the line decided it.
    first_exit = next(r for r in records if r["event"] == "child.exit")
    assert first_exit["returncode"] in (1, -15)


def test_two_identical_crash_lines_end_the_guard_with_that_line(tmp_path: Path) -> None:
    """Issue 19 item 6: never a third identical launch (the window would allow five)."""
    crash = [*START, HEADER, *FRAMES, "RuntimeError: CUDA error: an illegal memory access was "
             "encountered (pid {pid})"]
    launcher = Launcher(tmp_path, [[*_prints(crash), ["exit", 1]]])
    code = supervise(_default_runtime(tmp_path, launcher, max_failures=5),
                     base_argv(free_port()))
    assert code == 75
    assert len(launcher.argvs()) == 2
    give_up = next(r for r in journal_events(tmp_path / "state") if r["event"] == "give_up")
    assert "same crash twice" in give_up["reason"]
    assert give_up["line"].startswith("RuntimeError: CUDA error: an illegal memory access")
