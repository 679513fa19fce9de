"""The real supervision loop (`Runtime` built directly) with scripted fake children.

The harness (the launcher, the health server, `supervise`) is tests/support/harness.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
import select
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_guard.common.outcomes import JournalEvent, LogFix
from sglang_guard.config.guardconfig import HealthSection
from sglang_guard.errors import EXIT_GIVE_UP, EXIT_OK
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.supervise import machine
from sglang_guard.supervise.events import ChildOutput
from sglang_guard.supervise.shell import supervisor
from sglang_guard.supervise.shell.journal import Journal
from sglang_guard.supervise.shell.observer import Quiet
from sglang_guard.supervise.shell.supervisor import Supervisor, run_supervisor
from support.children import HashSink
from support.harness import (
    HEALTH_HOST,
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
from support.pack import CRASH_LINE, DRAFT_LINE, FA3_LINE, GIVE_UP_LINE
from support.procs import free_port, wait_gone

# --- the tests ---------------------------------------------------------------------------------


def test_fatal_line_drops_the_flag_and_the_next_launch_reaches_ready(
        tmp_path: Path, server: HealthServer) -> None:
    launcher = Launcher(tmp_path, [
        [["print", "stderr", FA3_LINE], ["exit", 1]],
        ready_then_wait(),
    ])
    rt = make_runtime(tmp_path, launcher)
    argv = base_argv(server.port, "--attention-backend", "fa3")
    code = supervise(rt, argv, terminate_when(tmp_path / "state", "ready"))
    assert code == EXIT_OK
    first, second = launcher.argvs()
    assert first == argv
    assert second == base_argv(server.port)
    assert server.hits.get("/health", 0) >= 1
    events = [r["event"] for r in journal_events(tmp_path / "state")]
    assert events.count("child.start") == 2
    assert "backoff" not in events  # a fix is not a crash
    assert events[-1] == "guard.exit"


def test_crash_loop_gives_up_with_75_in_bounded_time(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, [[["print", "stderr", "boom"], ["exit", 3]]])
    rt = make_runtime(tmp_path, launcher, max_failures=3, window_s=60.0)
    started = time.monotonic()
    code = supervise(rt, base_argv(free_port()))
    assert code == EXIT_GIVE_UP
    assert time.monotonic() - started < 15
    assert len(launcher.argvs()) == 3
    records = journal_events(tmp_path / "state")
    assert [r["returncode"] for r in records if r["event"] == "child.exit"] == [3, 3, 3]
    assert [r["event"] for r in records].count("backoff") == 2
    give_up = next(r for r in records if r["event"] == "give_up")
    assert "crash loop: 3 failures" in give_up["reason"]


def test_huge_line_and_binary_output_pass_through_and_matching_goes_on(tmp_path: Path) -> None:
    size = 100 * (1 << 20)
    blob = random.Random(7).randbytes(1 << 20)  # noqa: S311 - test data, as fakechild makes it
    launcher = Launcher(tmp_path, [[
        ["fill", "stdout", size, "x"], ["hex", "stdout", "0a"],
        ["random", "stderr", 1 << 20, 7], ["hex", "stderr", "00ff1b5b306d0a"],
        ["print", "stderr", GIVE_UP_LINE], ["wait_term"], ["exit", 0],
    ]])
    out, err = HashSink(), io.BytesIO()
    rt = make_runtime(tmp_path, launcher, stdout=out, stderr=err)
    code = supervise(rt, base_argv(free_port()))
    assert code == EXIT_GIVE_UP
    want = hashlib.sha256()
    for _ in range(100):
        want.update(b"x" * (1 << 20))
    want.update(b"\n")
    assert (out.size, out.sha.hexdigest()) == (size + 1, want.hexdigest())
    assert err.getvalue() == blob + bytes.fromhex("00ff1b5b306d0a") + GIVE_UP_LINE.encode() + b"\n"
    planned = [r for r in journal_events(tmp_path / "state") if r["event"] == "give_up.planned"]
    assert [r["rule"] for r in planned] == ["port-busy"]


def test_catch_all_waits_and_the_specific_line_of_the_crash_wins(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, [
        [["print", "stderr", CRASH_LINE], ["print", "stderr", "  File x.py"],
         ["print", "stderr", FA3_LINE], ["wait_term"], ["exit", 1]],
        [["exit", 1]],
    ])
    rt = make_runtime(tmp_path, launcher)
    code = supervise(rt, base_argv(free_port(), "--attention-backend", "fa3"))
    assert code == EXIT_GIVE_UP  # launch 2 just exits: max_failures = 1
    assert "fa3" not in launcher.argvs()[1]
    records = journal_events(tmp_path / "state")
    assert [r["rule"] for r in records if r["event"] == "remediated"] == ["fa3-sm"]
    assert not any(r["event"] == "crash.detected" for r in records)


def test_liveness_failures_after_ready_restart_the_child(
        tmp_path: Path, server: HealthServer) -> None:
    server.status["/health_generate"] = 503
    launcher = Launcher(tmp_path, [ready_then_wait()])
    health = HealthSection(host=HEALTH_HOST, timeout_s=2.0, liveness_interval_s=0.05,
                           liveness_failures=2)
    rt = make_runtime(tmp_path, launcher, health=health, max_failures=2)
    code = supervise(rt, base_argv(server.port))
    assert code == EXIT_GIVE_UP
    records = journal_events(tmp_path / "state")
    events = [r["event"] for r in records]
    assert events.count("ready") == 2
    assert [r["streak"] for r in records if r["event"] == "liveness.failed"] == [1, 2, 1, 2]
    assert [r["returncode"] for r in records if r["event"] == "child.exit"] == [0, 0]
    assert "liveness probe failed" in next(r for r in records if r["event"] == "give_up")["reason"]


def test_a_fix_that_does_not_hold_restores_the_last_ready_command_line(
        tmp_path: Path, server: HealthServer) -> None:
    go = tmp_path / "go"
    launcher = Launcher(tmp_path, [
        [["print", "stdout", machine.READY_LINE], ["wait_file", str(go)],
         ["print", "stderr", DRAFT_LINE], ["wait_term"], ["exit", 0]],
        [["print", "stderr", DRAFT_LINE], ["wait_term"], ["exit", 0]],
        ready_then_wait(),
    ])
    rt = make_runtime(tmp_path, launcher)
    state = tmp_path / "state"

    def during(sup: Supervisor) -> None:
        wait_for(lambda: count(state, "ready") >= 1, what="first ready")
        go.touch()  # only now does launch 1 print its fatal line: after ready
        terminate_when(state, "ready", 2)(sup)

    argv = base_argv(server.port)
    assert supervise(rt, argv, during) == EXIT_OK
    fixed = [*argv, "--speculative-draft-attention-backend", "triton"]
    assert launcher.argvs() == [argv, fixed, argv]
    records = journal_events(state)
    restored = next(r for r in records if r["event"] == "restored")
    assert (restored["rule"], restored["argv_after"]) == ("draft-triton", argv)


def test_a_fix_that_does_not_hold_without_a_ready_line_gives_up(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, [[["print", "stderr", DRAFT_LINE], ["exit", 1]]])
    rt = make_runtime(tmp_path, launcher, max_failures=5)
    assert supervise(rt, base_argv(free_port())) == EXIT_GIVE_UP
    assert len(launcher.argvs()) == 2
    exit_ = [r for r in journal_events(tmp_path / "state") if r["event"] == "guard.exit"]
    assert "fired again after its fix" in exit_[0]["reason"]


def test_leftover_group_members_are_stopped_before_the_next_launch(tmp_path: Path) -> None:
    # The main process exits; a member of its group lives on with its pipes closed and
    # SIGTERM ignored. It must not outlive its launch (it would hold the GPU or the port).
    orphan = tmp_path / "orphan.pid"
    launcher = Launcher(tmp_path, [[["orphan", str(orphan)], ["exit", 1]], [["exit", 1]]])
    rt = make_runtime(tmp_path, launcher, max_failures=2, stop_grace_s=0.2)
    try:
        assert supervise(rt, base_argv(free_port())) == EXIT_GIVE_UP
        assert len(launcher.argvs()) == 2
        assert wait_gone([int(orphan.read_text())], timeout=10) == []
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(orphan.read_text()), signal.SIGKILL)


def test_journal_failure_is_reported_once_and_the_loop_goes_on(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, [[["print", "stdout", "hello"], ["exit", 1]]])
    out = io.BytesIO()
    rt = make_runtime(tmp_path, launcher, stdout=out)
    journal = Journal(Path("/dev/full"))  # every write fails with ENOSPC
    journal._fd = os.open(journal.path, os.O_WRONLY)
    cl = parse_command_line(tuple(base_argv(free_port())), rt.env.options)
    code = run_supervisor(rt, cl, journal)  # closes the journal
    assert code == EXIT_GIVE_UP
    assert out.getvalue() == b"hello\n"
    assert journal.error is not None


class _ChildGoneWhenJournaled(Quiet):
    """A listener that, hearing the `remediated` record, waits for the child's end."""

    def __init__(self) -> None:
        self.sup: Supervisor | None = None
        self.gone: list[bool] = []

    def record(self, event: JournalEvent) -> None:
        if isinstance(event, LogFix) and self.sup is not None and self.sup.child is not None:
            try:
                fd = os.pidfd_open(self.sup.child.pid)
            except ProcessLookupError:  # gone and reaped already: the SIGTERM went out first
                self.gone.append(True)
                return
            try:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                self.gone.append(bool(poller.poll(20_000)))  # bounded: the test's failure
            finally:
                os.close(fd)


def test_the_sigterm_of_a_fix_goes_out_before_its_step_journals(
        tmp_path: Path, server: HealthServer) -> None:
    """The decision's records (fsync'd, heard by every listener) come after the SIGTERM: a
    child that ends on SIGTERM is gone while its remediation is being journaled, and the
    journal still holds the records in their order."""
    launcher = Launcher(tmp_path, [
        [["print", "stderr", FA3_LINE], ["pause"]],  # SIGTERM left at its default: its end
        ready_then_wait(),
    ])
    listener = _ChildGoneWhenJournaled()
    rt = replace(make_runtime(tmp_path, launcher), observer=listener)

    def during(sup: Supervisor) -> None:
        listener.sup = sup
        terminate_when(tmp_path / "state", "ready")(sup)

    assert supervise(rt, base_argv(server.port, "--attention-backend", "fa3"), during) == EXIT_OK
    assert listener.gone == [True]
    events = [r["event"] for r in journal_events(tmp_path / "state")]
    assert events.index("remediated") < events.index("child.exit") < events.index("ready")
    exit_1 = next(r for r in journal_events(tmp_path / "state") if r["event"] == "child.exit")
    assert exit_1["returncode"] == -signal.SIGTERM
    assert "fa3" not in launcher.argvs()[1]


def test_a_flood_wakes_the_loop_once_per_stream_per_period_with_the_newest_tail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress evidence while starting: a chunk after a quiet spell is an event at once;
    the chunks after it within OUTPUT_EVERY_S wait, and the loop puts the newest when due."""
    clock = [100.0]
    monkeypatch.setattr(supervisor, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    rt = make_runtime(tmp_path, Launcher(tmp_path, [[["exit", 0]]]))
    sup = Supervisor(rt, parse_command_line(tuple(base_argv(free_port())), rt.env.options), None)
    try:
        sup.state = replace(sup.state, phase="starting", gen=1)
        on_chunk = sup._chunk_watcher(1)
        for i in range(1000):
            on_chunk("stdout", f"line {i}\n".encode())
        on_chunk("stderr", b"err 0\n")
        first = [sup.events.get_nowait(), sup.events.get_nowait()]
        assert sup.events.empty()
        assert [sup._output(e).tail for e in first if isinstance(e, ChildOutput)] == [
            "line 999", "err 0"]

        on_chunk("stdout", b"line 1000\n")
        on_chunk("stdout", b"line 1001\n")
        assert sup.events.empty()  # within the period: held back
        assert sup._next_event() is None  # not due yet (it waits the rest of the period)
        clock[0] += supervisor.OUTPUT_EVERY_S
        held = sup._next_event()
        assert isinstance(held, ChildOutput)
        assert sup._output(held).tail == "line 1001"
        assert sup._next_event() is None  # nothing else was held
    finally:
        sup._timers.close()
        sup._jobs.close()


def test_every_pipe_thread_rehearses_the_fatal_path_and_a_failing_rehearsal_stops_no_pump(
        tmp_path: Path, server: HealthServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each reader and scanner runs the rehearsal on itself before its first chunk
    (`Supervisor._warm_pump`); one that raises leaves the thread reading: the fatal line is
    still acted on and the next launch reaches ready."""
    threads: list[str] = []

    def rehearse(env: machine.Env, cl: object) -> None:
        threads.append(threading.current_thread().name)
        raise RuntimeError("rehearsal broke")

    monkeypatch.setattr(supervisor.machine, "rehearse", rehearse)
    launcher = Launcher(tmp_path, [
        [["print", "stderr", FA3_LINE], ["exit", 1]],
        ready_then_wait(),
    ])
    rt = make_runtime(tmp_path, launcher)
    argv = base_argv(server.port, "--attention-backend", "fa3")
    assert supervise(rt, argv, terminate_when(tmp_path / "state", "ready")) == EXIT_OK
    assert launcher.argvs() == [argv, base_argv(server.port)]
    assert {f"child-{gen}-{stream}-{role}" for gen in (1, 2) for stream in ("stdout", "stderr")
            for role in ("reader", "scanner")} <= set(threads)

