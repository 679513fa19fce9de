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

Beside it, issue 24's own measure: the fatal line to SIGTERM reaching the child (`arrival`),
for the guard and the floor in the three cases with a target. There the child's C-level
signal handler writes to a FIFO the bench polls (floodchild.py, `signal.set_wakeup_fd`): the
bench's wake-up on that FIFO is in the figure, so it is an upper bound. The child's end adds
to it what the machine takes to end a Python process (and what a supervisor's work beside
that end takes from it): the floor shows that part. The first bench timed a Python-level
SIGTERM handler, which ran only when the child's main thread next ran bytecode (c280cf2).
"""

from __future__ import annotations

import os
import select
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import sups
from floodchild import FLOOD_S
from measure import HERE, Figure, kill_tree, stop_process, wait_until
from reaction import SPECIFIC_RE

MODES = ("idle", "runs-on", "other-stream", "same-stream")
CAP_S = 15.0
FATAL_BY_S = 2 * FLOOD_S  # the child writes its fatal line FLOOD_S after its pid
# issue 24: <= 2 ms idle, <= 5 ms in a flood
TARGETS = {"idle": 0.002, "other-stream": 0.005, "same-stream": 0.005}
FLOOR_NEEDLE = "FlashAttention v3 Backend requires SM>=80"  # in SPECIFIC_RE's line
PEERS = (("listener", "supervisord + log listener"),
         ("floor", "floor: read, substring, killpg"))


ARRIVAL_HOWS = ("guard", "floor")  # the listener takes ~1 s or never: its end says enough


def one(workdir: Path, mode: str, how: str, peers: sups.Peers, *, arrival: bool = False
        ) -> float:
    """Seconds from the fatal write to the child's end, or with `arrival` to SIGTERM reaching
    it (CAP_S: never)."""
    workdir.mkdir(parents=True)
    fifo = -1
    if arrival:
        os.mkfifo(workdir / "arrival")
        fifo = os.open(workdir / "arrival", os.O_RDONLY | os.O_NONBLOCK)
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
        # From here the bench sleeps in one poll: no wake-ups of its own beside the reaction
        # (a 1 ms poll for the stamp ran beside it until now). The stamp is in place before
        # SIGTERM can reach the child (floodchild.py), so it is read after.
        poller = select.poll()
        poller.register(fifo if arrival else fd, select.POLLIN)
        if not poller.poll((FATAL_BY_S + CAP_S) * 1000):
            return CAP_S
        seen = time.monotonic()
        if arrival and os.read(fifo, 16)[:1] != bytes([signal.SIGTERM]):  # one per signal
            raise RuntimeError(f"flood {how}/{mode}: the child had another signal first")
        if not (workdir / "fatal").exists():
            raise RuntimeError(f"flood {how}/{mode}: the child ended before its line ({workdir})")
        return min(CAP_S, seen - float((workdir / "fatal").read_text()))
    finally:
        for held in (fd, fifo):
            if held >= 0:
                os.close(held)
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
        for mode in TARGETS:
            for how in ARRIVAL_HOWS:
                seconds = one(tmp / f"arrival-{mode}-{how}-{run}", mode, how, peers,
                              arrival=True)
                got.setdefault((mode, f"{how}-arrival"), []).append(seconds)
                print(f"  flood run {run + 1} {mode:<12} {how:<8} {seconds * 1e3:8.1f} ms"
                      " (SIGTERM's arrival)", file=sys.stderr)
    figures = []
    for mode, limit in TARGETS.items():
        fig = Figure(f"fatal line to SIGTERM in the child, {mode}", "ms", PEERS[1][1], "lower",
                     f"<= {limit * 1e3:g} ms median",
                     guard=[s * 1e3 for s in got[(mode, "guard-arrival")]],
                     peer=[s * 1e3 for s in got[(mode, "floor-arrival")]],
                     note=("issue 24's measure: the child's C-level handler writes to a FIFO "
                           "the bench polls (an upper bound)"))
        fig.met = statistics.median(fig.guard) <= limit * 1e3
        figures.append(fig)
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
