"""Stopping a tree, steady-state memory, and a crash loop, for each supervisor.

Stop: the child ignores SIGTERM and has two grandchildren that ignore it too, one in its
process group and one that started its own session (setsid). The supervisor gets SIGTERM (as
`systemctl stop` sends it); counted: processes of the tree alive when the supervisor has
exited, and seconds from SIGTERM until none is left (capped: the bench then kills them).
Every supervisor gets the same 2 s SIGTERM->SIGKILL grace and its documented tree settings.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import sups
from measure import (
    FAKE,
    HERE,
    Figure,
    alive,
    cpu_seconds,
    kill_tree,
    rss_mb,
    stop_process,
    wait_gone,
    wait_until,
)
from reactchild import READY

GRACE_S = 2.0
CAP_S = 15.0  # after this, survivors count as never stopping
SETTLE_S = 3.0  # memory: let each supervisor settle before reading its RSS
CRASH_WINDOW_S = 15.0
PEERS = ("supervisord", "circus")


def _start(tool: str, workdir: Path, child: list[str], peers: sups.Peers, *, grace: float,
           forever: bool = False) -> subprocess.Popen[bytes]:
    """Each supervisor with `grace`; `forever`: restart on every exit, never give up.

    "guard-nostatus" is the guard with its status port off.
    """
    restart = {"stop_grace_s": grace, **({"max_failures": 1_000_000} if forever else {})}
    start: dict[str, Callable[[], subprocess.Popen[bytes]]] = {
        "guard": lambda: sups.start_guard(workdir, child, restart=restart),
        "guard-nostatus": lambda: sups.start_guard(workdir, child, restart=restart,
                                                   status=False),
        "supervisord": lambda: sups.start_supervisord(
            workdir, peers, child, autorestart="true" if forever else "unexpected",
            startretries=1_000_000 if forever else 3, grace=grace),
        "circus": lambda: sups.start_circus(workdir, peers, child, respawn=True,
                                            max_retry=-1 if forever else 5, grace=grace),
    }
    return start[tool]()


def stop_one(tool: str, workdir: Path, peers: sups.Peers) -> tuple[int, float]:
    """(survivors when the supervisor exited, seconds until none remained)."""
    workdir.mkdir(parents=True)
    pidfile = workdir / "pids.json"
    script = [["ignore_term"], ["spawn", 1, False], ["spawn", 1, True],
              ["pidfile", str(pidfile)], ["print", "stdout", "tree-ready"], ["pause"]]
    child = [sys.executable, str(FAKE), json.dumps(script)]
    proc = _start(tool, workdir, child, peers, grace=GRACE_S)
    out = workdir / "out.log"
    try:
        ready = wait_until(lambda: out.exists() and out.read_bytes().count(b"gc-ready") >= 2
                           and pidfile.exists(), 60, poll=0.01)
        if not ready:
            raise RuntimeError(f"stop/{tool}: the tree never came up ({workdir})")
        info = json.loads(pidfile.read_text())
        pids = [info["pid"], *info["children"]]
        started = time.monotonic()
        stop_process(proc, timeout=60)
        survivors = len(alive(pids))
        left, _ = wait_gone(pids, max(0.0, CAP_S - (time.monotonic() - started)))
        return survivors, (CAP_S if left else time.monotonic() - started)
    finally:
        stop_process(proc)
        kill_tree(proc.pid)
        if pidfile.exists():
            info = json.loads(pidfile.read_text())
            for pid in alive([info["pid"], *info["children"]]):
                kill_tree(pid)


FLOOD_MB = 200  # what the child writes before its ready line, in the "after a flood" figure
# SGLang's prefill line without its "#"s: supervisord reads " #" in a command as a comment.
FLOOD_LINE = ("[2026-01-01 00:00:00 TP0] Prefill batch, new-seq: 1, new-token: 512, "
              "cached-token: 0, token usage: 0.01, running-req: 0, queue-req: 0\n")


def rss_one(tool: str, workdir: Path, peers: sups.Peers, flood_mb: int = 0) -> float:
    """RSS (MiB) of the supervisor process with one idle child, after it settled; with
    `flood_mb`, after the child first wrote that many MiB of log lines as fast as it could
    (a chatty start-up: the output file is the sink, which falls behind)."""
    workdir.mkdir(parents=True)
    script: list[list[object]] = [["print", "stdout", READY], ["pause"]]
    if flood_mb:
        script.insert(0, ["fill", "stdout", flood_mb * 2**20, FLOOD_LINE])
    proc = _start(tool, workdir, [sys.executable, str(FAKE), json.dumps(script)], peers,
                  grace=GRACE_S)
    out = workdir / "out.log"
    size = flood_mb * 2**20 + len(READY) + 1
    try:
        if not wait_until(lambda: out.exists() and out.stat().st_size >= size, 120, poll=0.01):
            raise RuntimeError(f"memory/{tool}: the child never started ({workdir})")
        time.sleep(SETTLE_S)  # bench settling time, not synchronisation
        return rss_mb(proc.pid)
    finally:
        stop_process(proc)
        kill_tree(proc.pid)


def crash_one(tool: str, workdir: Path, peers: sups.Peers) -> tuple[float, float]:
    """(spawns per minute, supervisor CPU seconds per minute) with a child that exits at once."""
    workdir.mkdir(parents=True)
    count = workdir / "spawns"
    proc = _start(tool, workdir, [sys.executable, str(HERE / "crashchild.py"), str(count)],
                  peers, grace=GRACE_S, forever=True)
    try:
        if not wait_until(count.exists, 60, poll=0.005):
            raise RuntimeError(f"crash/{tool}: no spawn ({workdir})")
        base, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(CRASH_WINDOW_S)  # the measurement window itself
        cpu, spent = cpu_seconds(proc.pid) - base, time.monotonic() - t0
        spawns = len(count.read_text().splitlines()) - 1
        return spawns / spent * 60, cpu / spent * 60
    finally:
        stop_process(proc)
        kill_tree(proc.pid)


def measure(tmp: Path, peers: sups.Peers, runs: int, *, crash_loop: bool = True
            ) -> list[Figure]:
    """Stop, memory and crash-loop figures against supervisord and circus."""
    tools = ("guard", *PEERS)
    surv: dict[str, list[float]] = {t: [] for t in tools}
    gone: dict[str, list[float]] = {t: [] for t in tools}
    rss: dict[str, list[float]] = {t: [] for t in (*tools, "guard-nostatus")}
    flooded: dict[str, list[float]] = {t: [] for t in tools}
    spawns: dict[str, list[float]] = {t: [] for t in tools}
    cpu: dict[str, list[float]] = {t: [] for t in tools}
    for run in range(runs):
        for tool in tools:
            n, secs = stop_one(tool, tmp / f"stop-{tool}-{run}", peers)
            surv[tool].append(n)
            gone[tool].append(secs)
            rss[tool].append(rss_one(tool, tmp / f"rss-{tool}-{run}", peers))
            flooded[tool].append(rss_one(tool, tmp / f"rss-flood-{tool}-{run}", peers, FLOOD_MB))
            print(f"  lifecycle run {run + 1} {tool:<12} survivors {n} gone after {secs:5.2f} s"
                  f"  rss {rss[tool][-1]:5.1f} MiB, after a flood {flooded[tool][-1]:5.1f} MiB",
                  file=sys.stderr)
            if tool == "guard":
                rss["guard-nostatus"].append(
                    rss_one("guard-nostatus", tmp / f"rss-guard-nostatus-{run}", peers))
                print(f"  lifecycle run {run + 1} guard, status port off  rss "
                      f"{rss['guard-nostatus'][-1]:5.1f} MiB", file=sys.stderr)
            if crash_loop:
                rate, c = crash_one(tool, tmp / f"crash-{tool}-{run}", peers)
                spawns[tool].append(rate)
                cpu[tool].append(c)
                print(f"  crash loop run {run + 1} {tool:<12} {rate:6.1f} spawns/min  "
                      f"cpu {c:5.2f} s/min", file=sys.stderr)
    figures = []
    for peer in PEERS:
        fig = Figure("survivors after stop", "processes", peer, "lower", "0 where peers leave some",
                     guard=surv["guard"], peer=surv[peer],
                     note="child and 2 grandchildren ignore SIGTERM, 1 grandchild setsid")
        fig.met = max(fig.guard) == 0
        figures.append(fig)
    for peer in PEERS:
        figures.append(Figure("time until no process of the tree remains", "s", peer, "lower",
                              guard=gone["guard"], peer=gone[peer],
                              note=f"grace {GRACE_S:g} s for all; {CAP_S:g} = never (cap)"))
    for name, guard in (("", "guard"), (", status port off", "guard-nostatus")):
        for peer in PEERS:
            fig = Figure(f"steady-state RSS, one idle child{name}", "MiB", peer, "lower",
                         "<= 1.5x supervisord" if peer == "supervisord" else "",
                         guard=rss[guard], peer=rss[peer],
                         note="status port on (the default), on a free port" if not name
                         else "no /metrics: prometheus-client not imported")
            if peer == "supervisord" and (ratio := fig.ratio()) is not None:
                fig.met = ratio <= 1.5
            figures.append(fig)
    for peer in PEERS:
        fig = Figure(f"steady-state RSS after a {FLOOD_MB} MB start-up flood", "MiB", peer,
                     "lower", "<= 1.5x supervisord" if peer == "supervisord" else "",
                     guard=flooded["guard"], peer=flooded[peer],
                     note=f"the child writes {FLOOD_MB} MiB of log lines, then the ready "
                          f"line, then idles; RSS {SETTLE_S:g} s after the last byte reached "
                          "the output file")
        if peer == "supervisord" and (ratio := fig.ratio()) is not None:
            fig.met = ratio <= 1.5
        figures.append(fig)
    if crash_loop:
        for peer in PEERS:
            figures.append(Figure("crash loop: spawns", "per min", peer, "lower",
                                  guard=spawns["guard"], peer=spawns[peer],
                                  note=f"{CRASH_WINDOW_S:g} s window, give-up limits off"))
        for peer in PEERS:
            figures.append(Figure("crash loop: supervisor CPU", "CPU s/min", peer, "lower",
                                  guard=cpu["guard"], peer=cpu[peer]))
    return figures
