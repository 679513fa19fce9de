"""Pass-through when the child writes one line per write, as a logging handler does.

    python bench/per_line_writes.py [--lines 1000000] [--runs 5] [--tools guard,supervisord,cat]

`bench/run`'s pass-through child writes 64 KiB at a time; SGLang's logging writes each
record with its own write, and a supervisor that keeps pace with its child then wakes for
every line or few. Here the same log mix (its 1 MiB lines left out: no handler writes one)
is written a line per `os.write` (compare/replay.py --per-line) under each tool, the tools
taking turns going first; as in `bench/run`, time runs from the child's first byte to the
last byte on disk and every output must equal the input. Prints each run, then per tool the
medians: rate, the supervisor's CPU per million lines (user and system), the guard's pump
threads, and the ratio of each median rate to supervisord's. The child is the limit here
(a Python loop of writes): what the figures compare is what each supervisor spends to keep
up with it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "compare"))

import pass_through  # noqa: E402
import peers as peer_env  # noqa: E402

from sglang_guard.supervise.shell.child import READ_CHUNK  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tools", default="guard,supervisord,cat")
    args = ap.parse_args()
    tools = args.tools.split(",")
    peers = peer_env.ensure()
    with tempfile.TemporaryDirectory(prefix="per-line-") as tmp:
        src = Path(tmp) / "log.log"
        pass_through.corpus(args.lines, src, "log")
        data = b"".join(line for line in src.read_bytes().splitlines(keepends=True)
                        if len(line) < READ_CHUNK)
        src.write_bytes(data)
        n, size = data.count(b"\n"), len(data)
        print(f"# log mix, {n:,} lines, {size / 1e6:.0f} MB, one write per line; "
              f"{args.runs} runs, tools in turn", flush=True)
        got: dict[str, list[tuple[float, float, float, dict[str, float]]]] = {t: [] for t in tools}
        for run in range(args.runs):
            order = tools[run % len(tools):] + tools[:run % len(tools)]
            for tool in order:
                done = pass_through.one(tool, Path(tmp) / f"{tool}-{run}", src, size, peers,
                                        per_line=True)
                same = done.out.stat().st_size == size and done.out.read_bytes() == data
                done.out.unlink()
                if not same:
                    print(f"{tool} run {run + 1}: the output is not the input", file=sys.stderr)
                    return 1
                user, system = (c * 1e6 / n for c in done.cpu)
                roles = {k: v * 1e6 / n for k, v in done.roles.items()}
                got[tool].append((n / done.seconds / 1e3, user, system, roles))
                print(f"  run {run + 1} {tool:12s} {n / done.seconds / 1e3:8,.0f} k lines/s  "
                      f"user {user:.3f}  system {system:.3f} CPU s/M", flush=True)
        base = statistics.median(r[0] for r in got.get("supervisord", [])) if (
            "supervisord" in got) else None
        for tool, rows in got.items():
            rate = statistics.median(r[0] for r in rows)
            user = statistics.median(r[1] for r in rows)
            system = statistics.median(r[2] for r in rows)
            threads = {k: round(statistics.median(r[3].get(k, 0.0) for r in rows), 3)
                       for k in ("read", "scan", "write")} if tool == "guard" else None
            ratio = f"  {rate / base:.2f}x supervisord" if base else ""
            print(f"{tool:12s} {rate:8,.0f} k lines/s  CPU s/M {user + system:.3f} (user "
                  f"{user:.3f}, system {system:.3f}){ratio}"
                  + (f"  threads {threads}" if threads else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
