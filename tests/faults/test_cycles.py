"""Crash/restart cycles: ~100 in CI, 1,000 as a soak.

What must hold at the end, measured on the guard process once its last launch is ready,
against a guard that ran one launch with the same config: no more open file descriptors,
no more threads, no zombie children, RSS within a small margin; and every line of every
launch passed through.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from sglang_guard.errors import EXIT_OK
from support.guards import GuardRun, argv_for, guard_toml, leftovers
from support.harness import HealthServer, Launcher, count, ready_then_wait, wait_for

RSS_MARGIN_MB = 15.0


def _resources(tmp: Path, pack: Path, start_guard: type[GuardRun], cycles: int
               ) -> dict[str, Any]:
    """Run `cycles` crashes then a launch that stays up; the guard's resources then."""
    tmp.mkdir()
    crash: list[list[Any]] = [["print", "stdout", "crash-cycle"], ["exit", 1]]
    launcher = Launcher(tmp, [*([crash] * cycles), ready_then_wait()])
    state = tmp / "state"
    with HealthServer() as server:
        config = guard_toml(tmp, launcher, pack, max_failures=cycles + 10, window_s=3600.0,
                            backoff_initial_s=0.001, backoff_max_s=0.002, stop_grace_s=0.5)
        run = start_guard(tmp, config, argv_for(server.port), state)
        wait_for(lambda: count(state, "ready") >= 1, timeout=30 + cycles * 0.5,
                 what=f"ready after {cycles} crashes")
        proc = psutil.Process(run.proc.pid)
        kids = proc.children()
        found = {
            "fds": proc.num_fds(),
            "threads": proc.num_threads(),
            "zombies": [k.pid for k in kids if k.status() == psutil.STATUS_ZOMBIE],
            "children": len(kids),
            "rss_mb": proc.memory_info().rss / 2**20,
        }
        run.proc.send_signal(signal.SIGTERM)
        code, out, err = run.wait(30)
    assert code == EXIT_OK, err
    assert out.count(b"crash-cycle\n") == cycles  # no line of any launch lost
    assert len(launcher.argvs()) == cycles + 1
    assert leftovers(launcher) == []
    return found


def _check(tmp_path: Path, pack: Path, start_guard: type[GuardRun], cycles: int) -> None:
    base = _resources(tmp_path / "base", pack, start_guard, 0)
    after = _resources(tmp_path / "cycles", pack, start_guard, cycles)
    assert after["zombies"] == []
    assert after["children"] == base["children"] == 1
    assert after["fds"] <= base["fds"], (base, after)
    assert after["threads"] <= base["threads"], (base, after)
    assert after["rss_mb"] <= base["rss_mb"] + RSS_MARGIN_MB, (base, after)


def test_100_crash_cycles_leak_nothing(
        tmp_path: Path, pack: Path, start_guard: type[GuardRun]) -> None:
    _check(tmp_path, pack, start_guard, 100)


@pytest.mark.soak
def test_1000_crash_cycles_leak_nothing(
        tmp_path: Path, pack: Path, start_guard: type[GuardRun]) -> None:
    _check(tmp_path, pack, start_guard, 1000)
