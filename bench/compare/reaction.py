"""Reaction: from the child writing a fatal line to the corrected child running.

The child (reactchild.py) stamps both moments with CLOCK_MONOTONIC. Three ways to react:
- the guard, default rule pack and default settings: the specific line is a fix
  (`fa3-requires-sm80-sm90`: drop `--attention-backend fa3`), applied at once; a line only
  the catch-all `scheduler-crash` rule matches waits SETTLE_S (2 s) for a more specific line
  of the same crash, then counts as a crash (backoff 1-1.25 s): also measured, as it is;
- supervisord with a PROCESS_LOG listener restarting on the same regex (listener.py);
- restart on exit only (supervisord autorestart=true: what systemd `Restart=` does): the
  child's own 5 s crash-diagnostics sleep decides.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import sups
from measure import HERE, Figure, kill_tree, stop_process, wait_until

SPECIFIC_RE = r"FlashAttention v3 Backend requires SM>=80 and SM<=90\."
CATCHALL_RE = r"Scheduler hit an exception: "
GRACE_S = 20.0  # the guard's default [restart] stop_grace_s


def one(workdir: Path, mode: str, how: str, peers: sups.Peers) -> float:
    """Seconds from the fatal line to launch 2 running, for one way of reacting."""
    workdir.mkdir(parents=True)
    child = [sys.executable, str(HERE / "reactchild.py"), str(workdir), mode]
    start: dict[str, Callable[[], subprocess.Popen[bytes]]] = {
        "guard": lambda: sups.start_guard(workdir, child,
                                          sglang_args=["--attention-backend", "fa3"]),
        "listener": lambda: sups.start_supervisord(
            workdir, peers, child, autorestart="unexpected",
            listener_regex=SPECIFIC_RE if mode == "specific" else CATCHALL_RE),
        "exit": lambda: sups.start_supervisord(workdir, peers, child, autorestart="true"),
    }
    proc = start[how]()
    try:
        running = wait_until((workdir / "running-2").exists, 60, poll=0.01)
        if not running:
            raise RuntimeError(f"{how}/{mode}: no second launch ({workdir})")
        if how == "guard" and mode == "specific":
            second = (workdir / "launches").read_text().splitlines()[1]
            if "fa3" in second:
                raise RuntimeError(f"the guard did not fix the command line: {second}")
        return float((workdir / "running-2").read_text()) - float((workdir / "fatal").read_text())
    finally:
        stop_process(proc)
        kill_tree(proc.pid)


def measure(tmp: Path, peers: sups.Peers, runs: int) -> list[Figure]:
    """Reaction figures: guard vs the listener, vs exit-based restart, and the catch-all case."""
    got: dict[tuple[str, str], list[float]] = {}
    plan = [("specific", "guard"), ("specific", "listener"), ("specific", "exit"),
            ("catchall", "guard"), ("catchall", "listener")]
    for run in range(runs):
        for mode, how in plan:
            seconds = one(tmp / f"react-{mode}-{how}-{run}", mode, how, peers)
            got.setdefault((mode, how), []).append(seconds)
            print(f"  reaction run {run + 1} {mode:<8} {how:<8} {seconds:6.3f} s", file=sys.stderr)
    guard = got[("specific", "guard")]
    fast = max(guard) < 0.5 + GRACE_S
    vs_exit = Figure("reaction, fatal line with a fix", "s", "restart on exit (systemd-like)",
                     "lower", "< 0.5 s + grace, < exit-based", guard=guard,
                     peer=got[("specific", "exit")])
    vs_exit.met = fast and max(guard) < min(vs_exit.peer)
    vs_listener = Figure("reaction, fatal line with a fix", "s", "supervisord + log listener",
                         "lower", guard=guard, peer=got[("specific", "listener")],
                         note="the listener can only restart: the fix needs the guard")
    catchall = Figure("reaction, crash line only (catch-all)", "s", "supervisord + log listener",
                      "lower", guard=got[("catchall", "guard")],
                      peer=got[("catchall", "listener")],
                      note="guard waits 2 s for a specific line, then backs off 1-1.25 s")
    return [vs_exit, vs_listener, catchall]
