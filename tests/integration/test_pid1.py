"""Issue 22, item 4: the guard as PID 1 in a PID namespace leaves no zombies.

`unshare --pid --fork --mount-proc` makes the guard the namespace's first process, as a
container runtime does without an init. Each launch of the fake SGLang leaves a grandchild
that the supervisor's stop kills after SGLang exited: an orphan, reparented to PID 1.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil

from sglang_guard.errors import EXIT_OK
from support.guards import guard_toml
from support.harness import HealthServer, Launcher, base_argv, count, ready_then_wait, wait_for
from support.pack import PACK_TEXT
from support.pid1ns import needs_unshare, zombies

LAUNCHES = 3  # each ends in a crash that leaves an orphan


def namespace_pid1(unshare: psutil.Process) -> psutil.Process:
    """The namespace's PID 1 (unshare's only child), once it runs the guard."""
    return wait_for(lambda: next(iter(unshare.children()), None), what="PID 1 of the namespace")


def pid1_command(tmp_path: Path, health_port: int) -> tuple[list[str], Launcher]:
    crash = [["spawn", 1, False], ["print", "stderr", "boom"], ["exit", 1]]
    launcher = Launcher(tmp_path, [crash] * LAUNCHES + [ready_then_wait()])
    pack = tmp_path / "rules.toml"
    pack.write_text(PACK_TEXT)
    config = guard_toml(tmp_path, launcher, pack, status=None, max_failures=LAUNCHES + 2)
    with config.open("a") as fh:
        fh.write('[status]\nlisten = "off"\n')
    return ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "sglang_guard",
            "run", "--config", str(config), "--state-dir", str(tmp_path / "state"),
            "--no-preflight", "--", *base_argv(health_port)], launcher


@needs_unshare
def test_the_guard_as_pid_1_reaps_orphans_and_stops_on_sigterm(tmp_path: Path) -> None:
    with HealthServer() as health:
        cmd, launcher = pid1_command(tmp_path, health.port)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL)
        try:
            pid1 = namespace_pid1(psutil.Process(proc.pid))
            wait_for(lambda: count(tmp_path / "state", "ready") >= 1, timeout=60,
                     what=f"ready after {LAUNCHES} crashes")
            assert len(launcher.argvs()) == LAUNCHES + 1
            # every orphan was killed with its launch's tree; none is left a zombie
            wait_for(lambda: not zombies(pid1), timeout=10,
                     what="no zombie in the namespace")
            pid1.send_signal(signal.SIGTERM)  # what the kubelet sends PID 1 on pod delete
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == EXIT_OK, err
    assert count(tmp_path / "state", "guard.exit") == 1
