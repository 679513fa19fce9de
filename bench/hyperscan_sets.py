"""The running phase's Hyperscan set, whole and one pattern at a time, on the installed build.

    python bench/hyperscan_sets.py [--mix log|near-miss] [--lines 1000000] [--rounds 3]
    PYTHONPATH=DIR python bench/hyperscan_sets.py      # another build, installed into DIR

Per million lines of a pass-through mix (bench/compare/pass_through.py's corpus, 256 KiB
chunks as the pumps read them), the best of `--rounds`: the set as the guard compiles it
(each pattern widened, cut at its first top-level `.*`, run on to its line's end:
rules/blockscan.py), the same without the line tail, and each pattern alone. Where the
whole set costs much more than its patterns alone, the build's search for several literals
at once is the slow part (bench/README.md, "The log path, seventh round").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "compare"))

import hyperscan as hs  # noqa: E402
import pass_through  # noqa: E402

from sglang_guard.rules.blockscan import line_expression  # noqa: E402
from sglang_guard.rules.rules import Matcher, load_default_packs  # noqa: E402
from sglang_guard.supervise.shell.child import READ_CHUNK  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mix", default="log", choices=pass_through.MIXES)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    # the running phase's scan, exactly as the guard builds it (a bench may read inside)
    patterns = Matcher(load_default_packs())._lines_running.patterns
    print(f"hyperscan {getattr(hs, '__version__', '?')} ({hs.__file__}); "
          f"{len(patterns)} patterns in the running set")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "corpus.log"
        lines, _ = pass_through.corpus(args.lines, src, args.mix)
        data = src.read_bytes()
    chunks = [data[i:i + READ_CHUNK] for i in range(0, len(data), READ_CHUNK)]
    whole = [line_expression(p) for p in patterns]
    sets = {"whole set, as the guard compiles it": whole,
            "whole set, no line tail": [line_expression(p, to_line_end=False) for p in patterns],
            **{f"alone: {p[:60]}": [e] for p, e in zip(patterns, whole, strict=True)}}
    for name, expressions in sets.items():
        seconds, matches = _scan(expressions, chunks, args.rounds)
        print(f"{seconds * 1e6 / lines:.4f} s per 1M lines  {matches:>7} matches  {name}",
              flush=True)
    return 0


def _scan(expressions: list[str], chunks: list[bytes], rounds: int) -> tuple[float, int]:
    db: Any = hs.Database(mode=hs.HS_MODE_BLOCK)
    db.compile(expressions=[e.encode() for e in expressions],
               ids=list(range(len(expressions))), elements=len(expressions),
               flags=[hs.HS_FLAG_PREFILTER] * len(expressions))
    scratch = hs.Scratch(db)
    count = [0]

    def on_match(*_args: object) -> None:
        count[0] += 1

    best = float("inf")
    for _ in range(rounds):
        count[0] = 0
        started = time.perf_counter()
        for chunk in chunks:
            db.scan(chunk, match_event_handler=on_match, scratch=scratch)
        best = min(best, time.perf_counter() - started)
    return best, count[0]


if __name__ == "__main__":
    sys.exit(main())
