"""Reaction in a flood: from the child writing a fatal line to SIGTERM ending the child.

Four cases (floodchild.py): the child is quiet (`idle`), is quiet but computes on after its
fatal line as SGLang's scheduler does (`runs-on`: no target, issue 24 names the other
three), floods stdout while the fatal line comes on stderr (`other-stream`), or writes the
fatal line inside its stdout flood (`same-stream`). The guard (default pack; the
`fa3-requires-sm80-sm90` line is a fix, acted on at once) against supervisord with the
PROCESS_LOG listener restarting on the same regex, and against the floor: floorsup.py, one
thread per pipe that reads, writes and SIGTERMs the group on a substring of the fatal line
(what this machine's wake-ups and the child's end cost, with no supervisor's work between
them).
Timed on CLOCK_MONOTONIC from the stamp the child writes just before its fatal write to the
end of the child (it leaves SIGTERM at its default action: SIGTERM is its end), seen on a
pidfd opened before the fatal line. A peer that never stops the child within CAP_S counts as
CAP_S.
"""

from __future__ import annotations

import os
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import sups
from measure import HERE, Figure, kill_tree, stop_process, wait_until
from reaction import SPECIFIC_RE

MODES = ("idle", "runs-on", "other-stream", "same-stream")
CAP_S = 15.0
# issue 24: <= 2 ms idle, <= 5 ms in a flood
TARGETS = {"idle": 0.002, "other-stream": 0.005, "same-stream": 0.005}
FLOOR_NEEDLE = "FlashAttention v3 Backend requires SM>=80"  # in SPECIFIC_RE's line
PEERS = (("listener", "supervisord + log listener"),
         ("floor", "floor: read, substring, killpg"))


def one(workdir: Path, mode: str, how: str, peers: sups.Peers) -> float:
    """Seconds from the fatal write to SIGTERM in the child (CAP_S: never)."""
    workdir.mkdir(parents=True)
    child = [sys.executable, str(HERE / "floodchild.py"), str(workdir), mode]
    start: dict[str, Callable[[], subprocess.Popen[bytes]]] = {
        "guard": lambda: sups.start_guard(workdir, child,
                                          sglang_args=["--attention-backend", "fa3"]),
        "listener": lambda: sups.start_supervisord(workdir, peers, child,
                                                   autorestart="unexpected",
                                                   listener_regex=SPECIFIC_RE),
        "floor": lambda: sups.start_floor(workdir, child, FLOOR_NEEDLE),
    }
    proc = start[how]()
    fd = -1
    try:
        if not wait_until((workdir / "pid").exists, 60, poll=0.005):
            raise RuntimeError(f"flood {how}/{mode}: the child never started ({workdir})")
        fd = os.pidfd_open(int((workdir / "pid").read_text()))
        if not wait_until((workdir / "fatal").exists, 60, poll=0.001):
            raise RuntimeError(f"flood {how}/{mode}: the child never wrote its line ({workdir})")
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if not poller.poll(CAP_S * 1000):
            return CAP_S
        return time.monotonic() - float((workdir / "fatal").read_text())
    finally:
        if fd >= 0:
            os.close(fd)
        stop_process(proc)
        kill_tree(proc.pid)
        for log in ("out.log", "err.log"):  # up to a GB of flood each
            (workdir / log).unlink(missing_ok=True)


def measure(tmp: Path, peers: sups.Peers, runs: int) -> list[Figure]:
    """One figure per case: the guard against supervisord + listener."""
    got: dict[tuple[str, str], list[float]] = {}
    for run in range(runs):
        for mode in MODES:
            for how in ("guard", *(how for how, _ in PEERS)):
                seconds = one(tmp / f"flood-{mode}-{how}-{run}", mode, how, peers)
                got.setdefault((mode, how), []).append(seconds)
                print(f"  flood run {run + 1} {mode:<12} {how:<8} {seconds * 1e3:8.1f} ms",
                      file=sys.stderr)
    figures = []
    for mode in MODES:
        limit = TARGETS.get(mode)
        for how, peer in PEERS:
            fig = Figure(f"fatal line to the child's end, {mode}", "ms", peer, "lower",
                         f"<= {limit * 1e3:g} ms median" if limit and how == "listener" else "",
                         guard=[s * 1e3 for s in got[(mode, "guard")]],
                         peer=[s * 1e3 for s in got[(mode, how)]],
                         note=(f"{CAP_S:g} s = never stopped; flood = 64 KiB writes of log lines"
                               if how == "listener" else
                               "bench/compare/floorsup.py: no rules, lines or decisions"))
            if limit is not None and how == "listener":
                fig.met = statistics.median(fig.guard) <= limit * 1e3
            figures.append(fig)
    return figures
