"""Shared pieces of the comparison bench: figures, statistics, process probes, waits.

A figure is one measured quantity for the guard and one peer, over repeated runs; its ratio
is the median of the per-run ratios guard/peer (runs are paired: same input, same minute).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FAKE = REPO / "tests" / "fakechild.py"


@dataclass
class Figure:
    """One row of the table: a quantity measured for the guard and a peer in the same runs."""

    name: str
    unit: str
    peer_name: str
    better: str  # "higher" or "lower": which way is good, for the target column
    target: str = ""  # the target, in words ("" when there is none)
    met: bool | None = None  # set by the section once all runs are in
    guard: list[float] = field(default_factory=list)
    peer: list[float] = field(default_factory=list)
    note: str = ""

    def ratio(self) -> float | None:
        """Median of the per-run ratios guard/peer (None when a peer figure is 0)."""
        pairs = [g / p for g, p in zip(self.guard, self.peer, strict=False) if p]
        return statistics.median(pairs) if pairs else None

    def as_json(self) -> dict[str, Any]:
        """The JSON object `--json` writes for this figure."""
        return {
            "name": self.name, "unit": self.unit,
            "guard": statistics.median(self.guard) if self.guard else None,
            "peer": statistics.median(self.peer) if self.peer else None,
            "peer_name": self.peer_name, "ratio": self.ratio(),
            "guard_runs": self.guard, "peer_runs": self.peer,
            "target": self.target, "target_met": self.met, "note": self.note,
        }


def spread(values: Sequence[float]) -> str:
    """min/median/max, compact."""
    if not values:
        return "-"
    return "/".join(_num(v) for v in (min(values), statistics.median(values), max(values)))


def _num(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    if abs(v) >= 0.01:
        return f"{v:.3g}"
    return f"{v:.2g}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (all its threads)."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a live process (all its threads)."""
    t = psutil.Process(pid).cpu_times()
    return float(t.user), float(t.system)


def peak_rss_mib(pid: int) -> float:
    """A live process's peak resident set since it started (VmHWM), MiB (0.0: gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread of a process: its kernel name and user+system CPU seconds ({} once
    the process is gone). The guard names its pump threads (g1-stdout-scan, ...)."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[str, float]] = {}
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                raw = Path(task.path, "stat").read_bytes()
                name = raw[raw.index(b"(") + 1:raw.rindex(b")")].decode(errors="replace")
                fields = raw[raw.rindex(b")") + 2:].split()
                found[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return found


def rss_mb(pid: int) -> float:
    """Resident set size of one process, MiB."""
    return float(psutil.Process(pid).memory_info().rss) / 2**20


def wait_until(check: Callable[[], Any], timeout: float, poll: float = 0.002) -> Any:
    """Poll `check` until truthy; None on timeout (a bench waits, it does not assert)."""
    deadline = time.monotonic() + timeout
    while True:
        if value := check():
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(poll)


def wait_gone(pids: Iterable[int], timeout: float) -> tuple[list[int], float]:
    """Wait on pidfds until every pid exited: (still alive, seconds waited)."""
    started = time.monotonic()
    fds: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds[os.pidfd_open(pid)] = pid
    try:
        while fds:
            left = started + timeout - time.monotonic()
            if left <= 0:
                break
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            for fd, _ in poller.poll(left * 1000):
                os.close(fd)
                del fds[fd]
        return sorted(fds.values()), time.monotonic() - started
    finally:
        for fd in fds:
            os.close(fd)


def alive(pids: Iterable[int]) -> list[int]:
    """The pids that are running (zombies count as gone)."""
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant (clean-up between runs)."""
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        for kid in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                kid.kill()
        proc.kill()


def kill_strays(marker: str) -> int:
    """SIGKILL every process whose command line holds `marker` (this run's temp dir)."""
    n = 0
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid != os.getpid() and marker in " ".join(proc.info["cmdline"] or []):
            with contextlib.suppress(psutil.Error):
                proc.kill()
                n += 1
    return n


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM a supervisor, wait, SIGKILL it (and its tree) if it does not go."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait(10)


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
