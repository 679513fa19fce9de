"""Would scanning chunks on several threads lift the pump's scan thread? In-process figures.

    python bench/h200/scan_pool.py [--lines 1000000] [--workers 0,1,2,3] [--rounds 2]

The pump's scanner (supervise/shell/child.py) scans each chunk (Hyperscan, which runs without
the GIL) and then reads the lines its hits end in (Python), one chunk after another on one
thread: on the 16-core device hosts that thread is busy 0.88-0.96x of a pass-through run, and
so it sets the pace (bench/h200/h100-host-pass-flood-latest.txt). Here the same work is laid
out as a pipeline: `--workers N` threads scan chunks as they come (each chunk's Hits kept by
its number) and one thread reads the lines in order, waiting for each chunk's scan; 0 is the
pump as it is (one thread does both). For each mix: the wall time per million lines from the
first chunk handed to the last chunk read, and each role's CPU. The lines read must be the
same in every layout (checked). Nothing here is the product's code path: it measures
whether a pool is worth building, on the machine it runs on.
"""

from __future__ import annotations

import argparse
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "compare"))

from scan_cost import mix_chunks  # noqa: E402

from sglang_guard.rules.linereader import Hits, Line, LineReader  # noqa: E402
from sglang_guard.rules.rules import Matcher, load_default_packs  # noqa: E402
from sglang_guard.supervise.shell.child import SCAN_BEHIND  # noqa: E402
from sglang_guard.supervise.shell.supervisor import keeps, quick_for  # noqa: E402

AHEAD = 2 * SCAN_BEHIND  # chunks handed out before the line reader has read them


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--workers", default="0,1,2,3")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    matcher = Matcher(load_default_packs())
    matcher.prepare_scan()
    matcher.warm_thread()
    layouts = [int(n) for n in args.workers.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for mix, chunks, per_m in mix_chunks(args.lines, tmp):
            want: list[str] | None = None
            for rnd in range(args.rounds):
                for workers in layouts:
                    wall, cpu, got = run(matcher, chunks, workers)
                    texts = [line.text for line in got]
                    if want is None:
                        want = texts
                    assert texts == want, f"{mix}: {workers} workers read other lines"
                    roles = "  ".join(f"{k} {v * per_m:.3f}" for k, v in sorted(cpu.items()))
                    print(f"{mix} round {rnd + 1} workers {workers}: wall {wall * per_m:.3f} "
                          f"s/M  CPU s/M: {roles}", flush=True)
    return 0


def run(matcher: Matcher, chunks: list[bytes], workers: int
        ) -> tuple[float, dict[str, float], list[Line]]:
    """One pass over `chunks`; wall seconds, CPU seconds per role, the lines read."""
    def find(block: bytes) -> Hits:
        return matcher.line_scan(block, False)

    reader = LineReader(65536, find, lambda line: keeps(matcher, line),
                        quick=lambda hits: quick_for(matcher, hits))
    out: list[Line] = []
    cpu: dict[str, float] = {}
    lock = threading.Lock()
    fresh = [bytes(bytearray(chunk)) for chunk in chunks]  # a fresh buffer, as each read is
    started = time.perf_counter()
    if workers == 0:
        clock = time.thread_time()
        for chunk in fresh:
            out += reader.feed(chunk, reader.scan(chunk))
        cpu["both"] = time.thread_time() - clock
        return time.perf_counter() - started, cpu, out

    todo: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    hits: dict[int, Hits | None] = {}
    done = threading.Condition()
    room = threading.Semaphore(AHEAD)

    def scan() -> None:
        clock = time.thread_time()
        matcher.warm_thread()
        while (i := todo.get()) is not None:
            found = reader.scan(fresh[i])
            with done:
                hits[i] = found
                done.notify_all()
        with lock:
            cpu["scan"] = cpu.get("scan", 0.0) + time.thread_time() - clock

    def read() -> None:
        clock = time.thread_time()
        for i, chunk in enumerate(fresh):
            with done:
                done.wait_for(lambda i=i: i in hits)
                found = hits.pop(i)
            out.extend(reader.feed(chunk, found))
            room.release()
        cpu["lines"] = time.thread_time() - clock

    threads = [threading.Thread(target=scan) for _ in range(workers)]
    lines = threading.Thread(target=read)
    for thread in [*threads, lines]:
        thread.start()
    for i in range(len(fresh)):
        room.acquire()
        todo.put(i)
    for _ in threads:
        todo.put(None)
    lines.join()
    wall = time.perf_counter() - started
    for thread in threads:
        thread.join()
    return wall, cpu, out


if __name__ == "__main__":
    sys.exit(main())
