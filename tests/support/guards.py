"""`sglang-guard run` as a process: a guard TOML whose `[sglang] launch` runs the fake child.

Every guard a test starts listens on a port of its own for its status (`127.0.0.1:0`): tests
share a host with other guards, and no test binds the default 9488 or 9489.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from .harness import HEALTH_HOST, Launcher

Guard = Callable[..., subprocess.Popen[bytes]]
# Any free port, per guard: the default (9488) may be held by another guard on this host.
STATUS_LISTEN = "127.0.0.1:0"


def guard_toml(tmp: Path, launcher: Launcher, pack: Path, *,
               status: str | None = STATUS_LISTEN, **restart: Any) -> Path:
    """A guard config: the launcher as SGLang, the test pack only, tiny timings, and the
    status port at `status` (any free port unless given; None: no [status] section, the
    guard's own default)."""
    restart = {"max_failures": 1, "backoff_initial_s": 0.01, "backoff_max_s": 0.05,
               "stop_grace_s": 2.0, **restart}
    lines = ["[sglang]", f"launch = {json.dumps(launcher.command)}", "[restart]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in restart.items()]
    lines += ["[health]", f'host = "{HEALTH_HOST}"', "timeout_s = 2.0",
              "[rules]", "default_pack = false", f"packs = [{json.dumps(str(pack))}]",
              "[gpu]", 'sm = "none"', "[log]", 'format = "json"']
    if status is not None:
        lines += ["[status]", f"listen = {json.dumps(status)}"]
    path = tmp / "guard.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def finish(proc: subprocess.Popen[bytes], timeout: float = 30) -> tuple[int, str, str]:
    """Wait for the guard; its status, stdout and stderr."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def leftovers(launcher: Launcher) -> list[int]:
    """Live processes running this test's launcher (grandchildren are named by the pidfile)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if proc.info["status"] != psutil.STATUS_ZOMBIE and launcher.command[1] in cmd:
            found.append(proc.pid)
    return found


def argv_for(port: int, *more: str) -> list[str]:
    """An SGLang argv for the fake child (a secret included: it must never be logged)."""
    return ["--model-path", "/models/fake", "--port", str(port), "--api-key", "sekrit-9", *more]



class GuardRun:
    """`sglang-guard run` with its stdout in a file (for outputs too big for a pipe buffer)."""

    def __init__(self, tmp: Path, config: Path, argv: list[str], state: Path) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.stdout_path = tmp / "guard.stdout"
        self.stderr_path = tmp / "guard.stderr"
        cmd = [sys.executable, "-m", "sglang_guard", "run", "--config", str(config),
               "--state-dir", str(state), "--no-preflight", "--", *argv]
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         cwd=tmp)

    def wait(self, timeout: float = 60) -> tuple[int, bytes, str]:
        """The guard's exit status, stdout bytes and stderr text."""
        code = self.proc.wait(timeout)
        return (code, self.stdout_path.read_bytes(),
                self.stderr_path.read_text(errors="replace"))

    def kill(self) -> None:
        """Kill the guard and everything under it (test clean-up)."""
        if self.proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                for kid in psutil.Process(self.proc.pid).children(recursive=True):
                    kid.kill()
            self.proc.kill()
        self.proc.wait(30)


def sha_of(*parts: tuple[bytes, int]) -> tuple[int, str]:
    """(size, sha256) of the concatenation of `block * times` parts, without building it."""
    digest, size = hashlib.sha256(), 0
    for block, times in parts:
        for _ in range(times):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()

