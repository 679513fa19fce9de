"""Where the guard's pass-through time goes, per thread: py-spy samples `sglang-guard run`
while it passes one mix through (bench/compare/pass_through.py's corpus and child).

    python bench/h200/profile_pass.py OUT_DIR [--mix log] [--lines 4000000] [--rate 997]

Writes OUT_DIR/<mix>.raw (py-spy's collapsed stacks, one thread per root frame, `--idle`
off: only running samples) and prints the top frames per thread. py-spy must be on PATH.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "compare"))

import pass_through  # noqa: E402
import sups  # noqa: E402
from measure import HERE as COMPARE  # noqa: E402
from measure import kill_tree, stop_process, wait_until  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--mix", default="log")
    ap.add_argument("--lines", type=int, default=4_000_000)
    ap.add_argument("--rate", type=int, default=997)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / f"work-{args.mix}"
    work.mkdir(parents=True, exist_ok=True)
    src = work / "corpus.log"
    _, size = pass_through.corpus(args.lines, src, args.mix)
    gate, stamp, out = work / "gate", work / "stamp", work / "out.log"
    os.mkfifo(gate)
    child = [sys.executable, str(COMPARE / "replay.py"), str(src), str(gate), str(stamp)]
    guard = sups.start_guard(work, child, restart={"max_failures": 1})
    raw = args.out / f"{args.mix}.raw"
    spy = None
    try:
        fd = wait_until(lambda: pass_through._open_gate(gate), 60)
        if fd is None:
            raise RuntimeError("the replay child never started")
        spy = subprocess.Popen(["py-spy", "record", "--pid", str(guard.pid), "--threads",
                                "--format", "raw", "--rate", str(args.rate), "--nonblocking",
                                "--output", str(raw)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
        time.sleep(1.0)  # py-spy attached
        started = time.monotonic()
        os.close(fd)
        while not (out.exists() and out.stat().st_size >= size):
            time.sleep(0.01)
        took = time.monotonic() - float(stamp.read_text())
        print(f"{args.mix} {args.lines:,} lines: {took:.2f} s "
              f"({args.lines / took / 1e3:,.0f} k lines/s); sampled {time.monotonic() - started:.2f} s")
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            _, err = spy.communicate(timeout=60)
            if spy.returncode:
                print(err.decode(errors="replace")[-2000:], file=sys.stderr)
        stop_process(guard)
        kill_tree(guard.pid)
    _summary(raw)
    return 0


def _summary(raw: Path) -> None:
    """Samples per thread, and each thread's top leaf frames (own time)."""
    threads: collections.Counter[str] = collections.Counter()
    leaves: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        thread = frames[0]
        n = int(count)
        threads[thread] += n
        leaves[thread][frames[-1]] += n
    total = sum(threads.values())
    for thread, n in threads.most_common():
        print(f"{thread}: {n} samples ({n / total:.0%})")
        for frame, m in leaves[thread].most_common(8):
            print(f"    {m:6d}  {frame[:150]}")


if __name__ == "__main__":
    sys.exit(main())
