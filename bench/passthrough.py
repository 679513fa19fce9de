"""Log pass-through throughput of `sglang-guard run` (full default rule pack) against `cat`.

    python bench/passthrough.py [--lines 1000000] [--runs 3]

A child replays real SGLang log lines (from shared/reference and tests/data/sglang-logs) to
its stdout; the guard passes them through to a file while matching every line. Peers in the
same run: `cat` of the same file, and the replay child writing straight to the file. Every
byte is accounted for (sha256 of what came out). Also prints the guard's steady-state RSS
while supervising one idle child (target < 60 MB). Targets: >= 0.5x cat's rate.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
REPLAY = (
    "import shutil, sys\n"
    "with open(sys.argv[1], 'rb') as f: shutil.copyfileobj(f, sys.stdout.buffer, 1 << 16)\n"
)
IDLE = "import sys, time\nprint('The server is fired up and ready to roll!', flush=True)\ntime.sleep(3600)\n"


def corpus(lines: int, path: Path) -> int:
    """Write `lines` lines cycled from real SGLang logs; returns the byte count."""
    sources = [
        REPO.parent / "shared" / "reference" / "llama-cutedsl-cpu.log",
        *sorted((REPO / "tests" / "data" / "sglang-logs").glob("*.log")),
    ]
    pool = [
        ln
        for src in sources
        if src.exists()
        for ln in src.read_bytes().splitlines(keepends=True)
        if not ln.startswith(b"# ")
    ]
    pool = [ln if ln.endswith(b"\n") else ln + b"\n" for ln in pool]
    # Fatal lines would (rightly) make the guard stop the replay: keep the lines the full
    # default pack scans without acting on, which is what a healthy server's log is.
    from sglang_guard.rules.logline import clean
    from sglang_guard.rules.rules import Matcher, load_default_pack

    matcher = Matcher([load_default_pack()])
    pool = [ln for ln in pool if not matcher.candidates(clean(ln, 65536))] or [b"[x] healthy\n"]
    with path.open("wb") as out:
        # SGLang's ready line first: a server's log volume comes once it serves. Without it
        # the guard would spend the whole run in its start phase, journaling a stage change
        # for each cycle of the stored starts' markers (as bench/compare/pass_through.py).
        out.write(b"[2026-11-29 16:50:52] The server is fired up and ready to roll!\n")
        for i in range(lines - 1):
            out.write(pool[i % len(pool)])
    return path.stat().st_size


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def guard_config(tmp: Path, launch: list[str]) -> Path:
    cfg = tmp / "guard.toml"
    quoted = ", ".join(f'"{a}"' for a in launch)
    cfg.write_text(
        f"[sglang]\nlaunch = [{quoted}]\n[restart]\nmax_failures = 1\n[health]\nenabled = false\n"
    )
    return cfg


def run_guard(cfg: Path, state: Path, out: Path) -> tuple[float, float]:
    """(whole process seconds, seconds from child start to child exit per the journal)."""
    start = time.perf_counter()
    with out.open("wb") as fh:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "sglang_guard",
                "run",
                "--config",
                str(cfg),
                "--state-dir",
                str(state),
                "--no-preflight",
                "--log-format",
                "json",
                "--",
                "--port",
                "1",
            ],
            stdout=fh,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    whole = time.perf_counter() - start
    stamps = {
        e["event"]: datetime.fromisoformat(e["ts"])
        for e in map(json.loads, (state / "journal.jsonl").read_text().splitlines())
    }
    return whole, (stamps["child.exit"] - stamps["child.start"]).total_seconds()


def run_pipe(producer: list[str], out: Path) -> float:
    """producer | cat > out: cat as the pass-through process, the guard's peer."""
    start = time.perf_counter()
    with out.open("wb") as fh:
        prod = subprocess.Popen(producer, stdout=subprocess.PIPE)
        cat = subprocess.run(["cat"], stdin=prod.stdout, stdout=fh, check=True)
        assert prod.stdout is not None
        prod.stdout.close()
        prod.wait()
    del cat
    return time.perf_counter() - start


def run_cmd(cmd: list[str], out: Path) -> float:
    start = time.perf_counter()
    with out.open("wb") as fh:
        subprocess.run(cmd, stdout=fh, check=True)
    return time.perf_counter() - start


def steady_rss(tmp: Path) -> float:
    """RSS (MB) of a guard supervising one idle child, after it settled."""
    script = tmp / "idle.py"
    script.write_text(IDLE)
    cfg = guard_config(tmp, [sys.executable, str(script)])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sglang_guard",
            "run",
            "--config",
            str(cfg),
            "--state-dir",
            str(tmp / "rss-state"),
            "--no-preflight",
            "--",
            "--port",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(3.0)  # benchmark settling time, not test synchronisation
        return psutil.Process(proc.pid).memory_info().rss / 2**20
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pass-") as t:
        tmp = Path(t)
        src = tmp / "input.log"
        size = corpus(args.lines, src)
        want = sha(src)
        replay = tmp / "replay.py"
        replay.write_text(REPLAY)
        cfg = guard_config(tmp, [sys.executable, str(replay), str(src)])
        child = [sys.executable, str(replay), str(src)]
        results: dict[str, list[float]] = {
            "cat FILE > out": [],
            "child > out": [],
            "child | cat > out": [],
            "child | guard > out": [],
            "  (child start->exit)": [],
        }
        for n in range(args.runs):
            out = tmp / f"out-{n}"
            results["cat FILE > out"].append(run_cmd(["cat", str(src)], out))
            results["child > out"].append(run_cmd(child, out))
            results["child | cat > out"].append(run_pipe(child, out))
            if sha(out) != want:
                sys.exit(f"run {n}: cat's output differs from its input")
            whole, window = run_guard(cfg, tmp / f"state-{n}", out)
            results["child | guard > out"].append(whole)
            results["  (child start->exit)"].append(window)
            if sha(out) != want:
                sys.exit(f"run {n}: the guard's output differs from its input (bytes lost)")
        print(
            f"# {os.cpu_count()} cores; {args.lines} lines, {size / 2**20:.1f} MB of real SGLang "
            f"log lines; {args.runs} runs; output checksums equal to input: yes"
        )
        for name, samples in results.items():
            med = statistics.median(samples)
            print(
                f"{name:<22} median {med:6.2f} s  {args.lines / med / 1e3:8.0f} k lines/s  "
                f"{size / med / 2**20:7.1f} MB/s  (min {min(samples):.2f}, max {max(samples):.2f})"
            )
        med = {k: statistics.median(v) for k, v in results.items()}
        print(
            f"guard rate / cat rate, both as the pass-through of the same child: "
            f"{med['child | cat > out'] / med['child | guard > out']:.2f} whole process, "
            f"{med['child | cat > out'] / med['  (child start->exit)']:.2f} start->exit "
            "(target >= 0.5)"
        )
        print(
            f"guard steady-state RSS supervising one child: {steady_rss(tmp):.1f} MB (target < 60 MB)"
        )


if __name__ == "__main__":
    main()
