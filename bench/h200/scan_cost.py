"""What the guard's scan and line reading cost per million lines on this machine, in-process.

    python bench/h200/scan_cost.py [--lines 1000000] [--rounds 3]

For each pass-through mix (bench/compare/pass_through.py's corpus, running phase, the full
default pack, 256 KiB chunks as the pumps read them): the block scan alone (the running
phase's literals in C where built, else Hyperscan; no GIL either way), the line reader
alone (Python, and rules/_linescan.c's search and walk), and both on one thread fed over a
bounded queue, as the pumps' scanner thread did them both until the reader took the scan
(supervise/shell/child.py). CPU seconds per million lines; the scanner thread now does the
"lines" part (`bench/run`'s "guard scan thread" rows show how busy it is).
"""

from __future__ import annotations

import argparse
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "compare"))

import pass_through  # noqa: E402

from sglang_guard.rules import linescan  # noqa: E402
from sglang_guard.rules.linereader import Find, Hits, Line, LineReader  # noqa: E402
from sglang_guard.rules.quick import Quick  # noqa: E402
from sglang_guard.rules.rules import Matcher, load_default_packs  # noqa: E402
from sglang_guard.supervise.shell.child import READ_CHUNK, SCAN_BEHIND  # noqa: E402
from sglang_guard.supervise.shell.supervisor import keeps, quick_for  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    matcher = Matcher(load_default_packs())
    matcher.prepare_scan()
    matcher.warm_thread()

    def keep(line: Line) -> bool:  # the supervisor's own (Supervisor._keep)
        return keeps(matcher, line)

    def quick(hits: Hits) -> Quick | None:  # ... and its quick no (Supervisor._quick)
        return quick_for(matcher, hits)

    def find(block: bytes) -> Hits:
        return matcher.line_scan(block, False)

    print(f"line search in C: {linescan.first_line is not None}; "
          f"walk in C: {getattr(linescan, 'advance', None) is not None}")
    with tempfile.TemporaryDirectory() as tmp:
        for mix, chunks, per_m in mix_chunks(args.lines, tmp):
            for n in range(args.rounds):
                started = time.process_time()
                hits = [find(chunk) for chunk in chunks]
                scan = time.process_time() - started
                reader = LineReader(65536, find, keep, quick=quick)
                started = time.process_time()
                for chunk, hit in zip(chunks, hits, strict=True):
                    reader.feed(chunk, hit)
                feed = time.process_time() - started
                cpu, wall = _threaded(chunks, find, keep, quick)
                print(f"{mix} round {n + 1}: scan {scan * per_m:.3f}  lines {feed * per_m:.3f}  "
                      f"both {(scan + feed) * per_m:.3f}  on a thread {cpu * per_m:.3f} CPU, "
                      f"{wall * per_m:.3f} wall  (s per 1M lines)", flush=True)
    return 0


def mix_chunks(lines: int, tmp: str) -> Iterator[tuple[str, list[bytes], float]]:
    """Each pass-through mix of about `lines` lines (its file written under `tmp`), cut into
    READ_CHUNK chunks as the pumps read them, and the factor from seconds to seconds per
    million lines."""
    for mix in pass_through.MIXES:
        src = Path(tmp) / f"{mix}.log"
        n_lines, _ = pass_through.corpus(lines, src, mix)
        data = src.read_bytes()
        yield mix, [data[i:i + READ_CHUNK] for i in range(0, len(data), READ_CHUNK)], 1e6 / n_lines


def _threaded(chunks: list[bytes], find: Find, keep: Callable[[Line], bool],
              quick: Callable[[Hits], Quick | None]) -> tuple[float, float]:
    """Scan and read the chunks on a second thread, handed over as the pumps hand them."""
    handed: queue.Queue[bytes | None] = queue.Queue(SCAN_BEHIND)
    took: dict[str, float] = {}

    def scanner() -> None:
        reader = LineReader(65536, find, keep, quick=quick)
        cpu, wall = time.thread_time(), time.perf_counter()
        while (chunk := handed.get()) is not None:
            reader.feed(chunk, reader.scan(chunk))
        took["cpu"], took["wall"] = time.thread_time() - cpu, time.perf_counter() - wall

    thread = threading.Thread(target=scanner)
    thread.start()
    for chunk in chunks:
        handed.put(bytes(bytearray(chunk)))  # a fresh buffer, as each read is
    handed.put(None)
    thread.join()
    return took["cpu"], took["wall"]


if __name__ == "__main__":
    sys.exit(main())
