"""Signals from the first instruction, and the guard's own streams.

What must hold:
- SIGTERM during orphan clean-up or during the model probe: what was started is stopped (the
  probe subprocess), `guard.exit` is journaled, exit 0, nothing launched;
- a guard event never lands inside a line SGLang is still writing on the shared stderr;
- a stdout nobody reads (a full FIFO) does not hold the exit past the stop grace.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sglang_guard.errors import EXIT_OK
from sglang_guard.supervise.machine import READY_LINE
from support.guards import argv_for, guard_toml, leftovers
from support.harness import HealthServer, Launcher, count, journal_events, ready_then_wait, wait_for
from support.models import write_llama
from support.pack import PACK_TEXT
from support.procs import wait_gone

STUBBORN = ("import pathlib, signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: pathlib.Path(sys.argv[1]).write_text('x'))\n"
            "for _ in range(600): time.sleep(0.5)\n")
SLOW_PROBE = ("import os, pathlib, sys, time\n"
              "if 'sglang_guard.preflight.shell.modelprobe' in sys.orig_argv:\n"
              "    pathlib.Path(os.environ['PROBE_MARK']).write_text(str(os.getpid()))\n"
              "    time.sleep(120)\n")


def start(tmp: Path, config: Path, state: Path, argv: list[str], *, preflight: bool = False,
          env: dict[str, str] | None = None, stdout: int | None = None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "sglang_guard", "run", "--config", str(config),
           "--state-dir", str(state), *([] if preflight else ["--no-preflight"]), "--", *argv]
    return subprocess.Popen(cmd, stdout=stdout if stdout is not None else subprocess.DEVNULL,
                            stderr=(tmp / "guard.stderr").open("wb"), stdin=subprocess.DEVNULL,
                            cwd=tmp, env={**os.environ, **(env or {})})


@pytest.fixture
def stubborn(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A process that notes SIGTERM in a file and keeps running (an orphan SGLang worker)."""
    mark = tmp_path / "got-term"
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN, str(mark)], start_new_session=True)
    yield proc, mark
    proc.kill()
    proc.wait()


def _record_for(proc: subprocess.Popen[bytes], path: Path) -> None:
    ps = psutil.Process(proc.pid)
    gone = subprocess.Popen(["true"])
    gone_start = psutil.Process(gone.pid).create_time()
    gone.wait()
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    path.write_text(json.dumps({
        "guard_pid": gone.pid, "guard_start": gone_start, "boot_id": boot,
        "pgid": proc.pid, "token": "",
        "procs": [{"pid": proc.pid, "start": ps.create_time(), "cmdline": ps.cmdline()}]}))


def _exited_0_before_launch(guard: subprocess.Popen[bytes], tmp: Path, state: Path,
                            launcher: Launcher, within: float) -> None:
    started = time.monotonic()
    code = guard.wait(60)
    err = (tmp / "guard.stderr").read_text(errors="replace")
    assert code == EXIT_OK, err
    assert time.monotonic() - started < within, err
    exits = [r for r in journal_events(state) if r["event"] == "guard.exit"]
    assert len(exits) == 1 and exits[0]["code"] == 0, journal_events(state)
    assert launcher.argvs() == []  # nothing launched after the signal
    assert "Traceback" not in err


def test_sigterm_during_orphan_clean_up_exits_0_and_journals(
        tmp_path: Path, stubborn: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, mark = stubborn
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    _record_for(proc, state / "child.pgid")
    launcher = Launcher(tmp_path, [ready_then_wait()])
    pack = tmp_path / "rules.toml"
    pack.write_text(PACK_TEXT)
    config = guard_toml(tmp_path, launcher, pack, stop_grace_s=60.0)
    guard = start(tmp_path, config, state, argv_for(12345))
    wait_for(mark.exists, what="the clean-up's SIGTERM to the orphan")  # it now waits 60 s
    guard.send_signal(signal.SIGTERM)
    _exited_0_before_launch(guard, tmp_path, state, launcher, within=10)


def test_sigterm_during_the_model_probe_stops_the_probe_and_exits_0(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_PROBE)
    mark = tmp_path / "probe.pid"
    model = write_llama(tmp_path / "model")
    state = tmp_path / "state"
    launcher = Launcher(tmp_path, [ready_then_wait()])
    pack = tmp_path / "rules.toml"
    pack.write_text(PACK_TEXT)
    config = guard_toml(tmp_path, launcher, pack)
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "PROBE_MARK": str(mark), "SGLANG_GUARD_CACHE": str(tmp_path / "cache")}
    guard = start(tmp_path, config, state, ["--model-path", str(model), "--port", "12345"],
                  preflight=True, env=env)
    # The probe writes its pid; an existing but still empty file is not that yet.
    probe = int(wait_for(lambda: mark.exists() and mark.read_text().strip(),
                         what="the model probe subprocess"))
    guard.send_signal(signal.SIGTERM)
    _exited_0_before_launch(guard, tmp_path, state, launcher, within=10)
    assert wait_gone([probe], timeout=5) == [], "the model probe outlived the guard"
    assert not (state / "child.pgid").exists()


def test_a_guard_event_never_lands_inside_an_unfinished_sglang_line(tmp_path: Path) -> None:
    go = tmp_path / "go"
    launcher = Launcher(tmp_path, [[
        ["hex", "stderr", b"partial-".hex()], ["print", "stdout", READY_LINE],
        ["wait_file", str(go)], ["print", "stderr", "rest"], ["wait_term"], ["exit", 0]]])
    pack = tmp_path / "rules.toml"
    pack.write_text(PACK_TEXT)
    state = tmp_path / "state"
    with HealthServer() as server:
        config = guard_toml(tmp_path, launcher, pack, stop_grace_s=1.0)
        guard = start(tmp_path, config, state, argv_for(server.port))
        wait_for(lambda: count(state, "ready") >= 1, what="ready (an event while the line is open)")
        go.touch()
        wait_for(lambda: b"rest" in (tmp_path / "guard.stderr").read_bytes(), what="line end")
        guard.send_signal(signal.SIGTERM)
        assert guard.wait(30) == EXIT_OK
    err = (tmp_path / "guard.stderr").read_bytes()
    assert b"partial-rest\n" in err, err.decode(errors="replace")
    assert b'"event": "ready"' in err  # the event was written, after the line
    assert leftovers(launcher) == []


def test_a_blocked_stdout_does_not_hold_the_exit_past_the_grace(tmp_path: Path) -> None:
    fifo = tmp_path / "stdout.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # held open, never read
    writer = os.open(fifo, os.O_WRONLY)
    launcher = Launcher(tmp_path, [[
        ["fill", "stdout", 8 << 20, "x"], ["print", "stdout", ""], ["print", "stderr", "filled"],
        ["wait_term"], ["exit", 0]]])
    pack = tmp_path / "rules.toml"
    pack.write_text(PACK_TEXT)
    state = tmp_path / "state"
    try:
        config = guard_toml(tmp_path, launcher, pack, stop_grace_s=1.0)
        guard = start(tmp_path, config, state, argv_for(12346), stdout=writer)
        os.close(writer)
        wait_for(lambda: b"filled" in (tmp_path / "guard.stderr").read_bytes(),
                 what="the child's output queued behind the full FIFO")
        started = time.monotonic()
        guard.send_signal(signal.SIGTERM)
        try:
            code = guard.wait(20)
        except subprocess.TimeoutExpired:
            guard.kill()
            guard.wait()
            pytest.fail("the guard was still running 20 s after SIGTERM")
        took = time.monotonic() - started
    finally:
        os.close(reader)
    assert code == EXIT_OK, (tmp_path / "guard.stderr").read_text(errors="replace")
    assert took < 8, f"exit took {took:.1f} s with a 1 s stop grace"
    assert leftovers(launcher) == []
