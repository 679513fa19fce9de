"""Log pass-through: a child replays real SGLang log lines under each supervisor, and into cat.

The corpus is real SGLang 0.5.23 log lines (lines the guard's default pack acts on are left
out: they would, rightly, make it restart the replay), cycled to `lines` lines, then a burst
of very long lines (1 MiB each, real text joined). Each tool's output file must have the
input's SHA-256; a mismatch is reported in the table, not hidden.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import sups
from measure import HERE, REPO, Figure, cpu_seconds, kill_tree, stop_process, wait_until

LONG_LINE = 1 << 20
LONG_LINES = 32
TOOLS = ("guard", "supervisord", "circus", "cat")


def corpus(lines: int, path: Path) -> tuple[int, int]:
    """Write the corpus; (line count, byte count)."""
    from sglang_guard.core.logline import clean
    from sglang_guard.core.rules import Matcher, load_default_pack

    sources = [REPO.parent / "shared" / "reference" / "llama-cutedsl-cpu.log",
               *sorted((REPO / "tests" / "data" / "sglang-logs").glob("*.log"))]
    matcher = Matcher([load_default_pack()])
    pool = [ln.rstrip(b"\r\n") for src in sources if src.exists()
            for ln in src.read_bytes().splitlines() if ln.strip() and not ln.startswith(b"# ")]
    pool = [ln for ln in pool if not matcher.candidates(clean(ln, 65536))] or [b"[x] healthy"]
    filler = b" | ".join(pool)
    long_line = (filler * (LONG_LINE // len(filler) + 1))[:LONG_LINE]
    if matcher.candidates(clean(long_line, 65536)):
        long_line = b"x" * LONG_LINE
    with path.open("wb") as out:
        for i in range(lines):
            out.write(pool[i % len(pool)] + b"\n")
        for _ in range(LONG_LINES):
            out.write(long_line + b"\n")
    return lines + LONG_LINES, path.stat().st_size


def _sha(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _open_gate(gate: Path) -> int | None:
    try:  # ENXIO until the child has opened the FIFO for reading
        return os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return None


def one(tool: str, workdir: Path, src: Path, size: int, peers: sups.Peers
        ) -> tuple[float, float, Path]:
    """(seconds from the child's first byte to the last byte on disk, supervisor CPU s, out)."""
    workdir.mkdir(parents=True)
    gate, stamp, out = workdir / "gate", workdir / "stamp", workdir / "out.log"
    os.mkfifo(gate)
    child = [sys.executable, str(HERE / "replay.py"), str(src), str(gate), str(stamp)]
    procs: list[subprocess.Popen[bytes]] = []
    if tool == "cat":
        with out.open("wb") as fh:
            replay = subprocess.Popen(child, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
            procs += [replay, subprocess.Popen(["cat"], stdin=replay.stdout, stdout=fh)]
            assert replay.stdout is not None
            replay.stdout.close()
        watched = procs[1]
    else:
        start: dict[str, Callable[[], subprocess.Popen[bytes]]] = {
            "guard": lambda: sups.start_guard(workdir, child, restart={"max_failures": 1}),
            "supervisord": lambda: sups.start_supervisord(workdir, peers, child,
                                                          autorestart="false", startsecs=0),
            "circus": lambda: sups.start_circus(workdir, peers, child, respawn=False),
        }
        watched = start[tool]()
        procs.append(watched)
    try:
        fd = wait_until(lambda: _open_gate(gate), 60)
        if fd is None:
            raise RuntimeError(f"{tool}: the replay child never started ({workdir})")
        base = cpu_seconds(watched.pid)
        os.close(fd)  # the child reads EOF from the gate and starts copying
        cpu = base
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                cpu = cpu_seconds(watched.pid)  # the last sample before it exits (guard, cat)
            if out.exists() and out.stat().st_size >= size:
                break
            time.sleep(0.002)
        done = time.monotonic()
        with contextlib.suppress(Exception):
            cpu = cpu_seconds(watched.pid)
        return done - float(stamp.read_text()), cpu - base, out
    finally:
        for proc in reversed(procs):
            stop_process(proc)
            kill_tree(proc.pid)


def measure(tmp: Path, peers: sups.Peers, lines: int, runs: int) -> list[Figure]:
    """The pass-through figures: rate against each peer, CPU per million lines."""
    src = tmp / "corpus.log"
    n_lines, size = corpus(lines, src)
    want = _sha(src)
    secs: dict[str, list[float]] = {t: [] for t in TOOLS}
    cpus: dict[str, list[float]] = {t: [] for t in TOOLS}
    lost: list[str] = []
    for run in range(runs):
        for tool in TOOLS:
            seconds, cpu, out = one(tool, tmp / f"pass-{tool}-{run}", src, size, peers)
            if _sha(out) != want:
                lost.append(f"{tool} run {run + 1}: output {out.stat().st_size} B, checksum differs")
            secs[tool].append(seconds)
            cpus[tool].append(cpu)
            out.unlink()
            print(f"  pass-through run {run + 1} {tool:<12} {seconds:6.2f} s  cpu {cpu:5.2f} s",
                  file=sys.stderr)
    note = (f"{n_lines:,} lines, {size / 1e6:.0f} MB, incl. {LONG_LINES} lines of 1 MiB; "
            + ("checksums: " + "; ".join(lost) if lost else "every output's SHA-256 = input's"))
    figures = []
    for peer in ("supervisord", "circus", "cat"):
        target = {"supervisord": ">= 1.0x", "cat": ">= 0.5x"}.get(peer, "")
        fig = Figure("pass-through rate", "k lines/s", peer, "higher", target,
                     guard=[n_lines / s / 1e3 for s in secs["guard"]],
                     peer=[n_lines / s / 1e3 for s in secs[peer]], note=note)
        ratio = fig.ratio()
        if target and ratio is not None:
            fig.met = ratio >= (1.0 if peer == "supervisord" else 0.5) and not lost
        figures.append(fig)
    figures.append(Figure("pass-through bytes", "MB/s", "cat", "higher",
                          guard=[size / s / 1e6 for s in secs["guard"]],
                          peer=[size / s / 1e6 for s in secs["cat"]]))
    for peer in ("supervisord", "circus", "cat"):
        figures.append(Figure("supervisor CPU per 1M lines", "CPU s", peer, "lower",
                              guard=[c / n_lines * 1e6 for c in cpus["guard"]],
                              peer=[c / n_lines * 1e6 for c in cpus[peer]]))
    return figures
