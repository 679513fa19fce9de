"""Fault injection against `sglang-guard run` as a process, with the fake child as SGLang.

Helpers and fixtures come from the integration tier (Launcher, HealthServer, guard_toml,
wait_for, the journal readers). Long variants are marked `soak`: they are deselected unless
asked for (`python -m pytest tests/faults -m soak`).
"""

from __future__ import annotations

import contextlib
import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from integration.conftest import no_leaked_threads  # noqa: F401 - autouse fixture
from integration.test_cli_run import guard, pack  # noqa: F401 - fixtures

__all__ = ["GuardRun", "sha_of", "start_guard"]


def pytest_configure(config: pytest.Config) -> None:
    """Register the `soak` marker."""
    config.addinivalue_line("markers", "soak: long fault runs (1 GB, 1000 cycles); not in CI")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip soak tests unless a -m expression was given (CI runs the short variants)."""
    if config.option.markexpr:
        return
    skip = pytest.mark.skip(reason="soak test: run with `python -m pytest tests/faults -m soak`")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


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


@pytest.fixture
def start_guard(tmp_path: Path) -> Iterator[type[GuardRun]]:
    """Start guards with `start_guard(tmp, config, argv, state)`; killed at the end if left."""
    runs: list[GuardRun] = []

    class Tracked(GuardRun):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            runs.append(self)

    yield Tracked
    for run in runs:
        run.kill()


def sha_of(*parts: tuple[bytes, int]) -> tuple[int, str]:
    """(size, sha256) of the concatenation of `block * times` parts, without building it."""
    digest, size = hashlib.sha256(), 0
    for block, times in parts:
        for _ in range(times):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()
