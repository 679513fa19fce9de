"""How fast each published hyperscan wheel scans the guard's running-phase set, in-process.

    python bench/hyperscan_builds.py [--lines 1000000] [VERSION ...]

Each version is installed with pip (`--target`, no dependencies) into a temporary directory
put first on PYTHONPATH, and runs the pump's scan (rules/rules.Matcher.line_scan, running
phase, 256 KiB chunks) over the pass-through log mix, with a fresh scan cache. Prints its
Vectorscan version, CPU s per million lines (best of 3), and the scan's hits (they must equal
every other build's). Needs the package index.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "compare"))

import pass_through  # noqa: E402

VERSIONS = ["0.7.0", "0.7.9", "0.7.21", "0.7.23", "0.7.26", "0.7.27", "0.7.29", "0.7.30",
            "0.8.0", "0.8.1", "0.8.2", "0.9.0", "0.9.1"]

_MEASURE = r"""
import json, sys, time
import hyperscan
from sglang_guard.rules.rules import Matcher, load_default_packs
data = open(sys.argv[1], "rb").read()
chunks = [data[i:i + 262144] for i in range(0, len(data), 262144)]
m = Matcher(load_default_packs()); m.prepare_scan(); m.warm_thread()
best, hits = None, 0
for _ in range(3):
    started = time.process_time()
    found = [m.line_scan(c, False) for c in chunks]
    took = time.process_time() - started
    best = took if best is None else min(best, took)
    hits = sum(len(set(h.headers)) + len(h.rules or {}) for h in found)
db = hyperscan.Database(); db.compile(expressions=[b"x"], ids=[0], flags=[0])
print(json.dumps({"hyperscan": hyperscan.__version__ if hasattr(hyperscan, "__version__") else "?",
                  "info": db.info().decode(), "seconds": best, "hits": hits}))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("versions", nargs="*", default=VERSIONS)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "log.log"
        n_lines, size = pass_through.corpus(args.lines, src, "log")
        print(f"# log mix, {n_lines:,} lines, {size / 1e6:.0f} MB; Python "
              f"{sys.version.split()[0]}; CPU s per 1M lines, best of 3")
        for version in args.versions:
            target = Path(tmp) / f"hs-{version}"
            got = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                                  "--only-binary=:all:", "--target", str(target),
                                  f"hyperscan=={version}"], capture_output=True, text=True,
                                 check=False)
            if got.returncode:
                print(f"{version:8s} not installable here: {got.stderr.strip()[-200:]}")
                continue
            env = dict(os.environ, PYTHONPATH=str(target),
                       SGLANG_GUARD_CACHE=str(Path(tmp) / f"cache-{version}"))
            done = subprocess.run([sys.executable, "-c", _MEASURE, str(src)], env=env,
                                  capture_output=True, text=True, check=False)
            if done.returncode:
                print(f"{version:8s} failed: {done.stderr.strip()[-300:]}")
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            per_m = row["seconds"] / n_lines * 1e6
            print(f"{version:8s} {row['info']:40s} {per_m:8.4f} s/M  "
                  f"{size / row['seconds'] / 1e6:8,.0f} MB/s  hits {row['hits']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
