"""bench/run: the guard against supervisord, circus and cat, in one table.

    bench/run [--json PATH] [--runs 3] [--lines 1000000,4000000]
              [--only pass,reaction,flood,lifecycle,check]

Each figure is min/median/max over `--runs` runs, and its ratio to the peer measured in the
same runs (median of the per-run ratios guard/peer). Targets come from the issue; a missed
target reads MISSED in the table. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import check
import flood
import lifecycle
import pass_through
import peers as peer_env
import psutil
import reaction
from measure import REPO, Figure, kill_strays, spread

SECTIONS = ("pass", "reaction", "flood", "lifecycle", "check")


def machine() -> str:
    """One line: CPU, cores, memory, kernel, Python, load when the run began."""
    model = "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{model}; {os.cpu_count()} cores; {psutil.virtual_memory().total / 2**30:.0f} GiB; "
            f"Linux {platform.release()}; Python {platform.python_version()}; load {load}")


class Window:
    """How fast this machine ran while each section ran: a fixed piece of pure-Python work
    timed (best of 5) before and after the section, and the hypervisor's steal time over it
    (/proc/stat; 0 off a VM). A 2-core VM's wall-clock figures move 30-50% between windows
    with the same code doing the same work (the same instruction count: `check, cached,
    instructions`); this says which window a run had, where before only its peers' own
    figures did."""

    def __init__(self) -> None:
        self.rows: list[str] = []
        self._at: tuple[float, tuple[int, int] | None] | None = None

    @staticmethod
    def loop_ms() -> float:
        """The fixed work's best time of 5, in ms (on the 2-core VM ~12-14 quiet, ~20-22 slow)."""
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            sum(i * i for i in range(300_000))
            best = min(best, time.perf_counter() - start)
        return best * 1e3

    @staticmethod
    def _ticks() -> tuple[int, int] | None:
        """(steal, total) jiffies of all CPUs so far; None where /proc/stat says nothing."""
        try:
            fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
            values = [int(v) for v in fields]
        except (OSError, ValueError):
            return None
        # guest time is also counted in user time: leave it out of the total
        return (values[7] if len(values) > 7 else 0), sum(values[:8])

    def begin(self) -> None:
        self._at = (self.loop_ms(), self._ticks())

    def end(self, section: str) -> None:
        assert self._at is not None  # begin() first
        before, ticks = self._at
        after, now = self.loop_ms(), self._ticks()
        steal = ("steal ?" if ticks is None or now is None or now[1] <= ticks[1]
                 else f"steal {100 * (now[0] - ticks[0]) / (now[1] - ticks[1]):.1f}%")
        self.rows.append(f"{section} {before:.1f} -> {after:.1f} ms, {steal}")

    def line(self) -> str:
        return ("# window (a fixed loop's best of 5 before -> after each section; the "
                "hypervisor's steal time over it): " + "; ".join(self.rows))


def guard_build() -> str:
    """One line: what the guard's own processes import (asked of a child with this
    interpreter and environment, as the bench starts the guard): its commit, the Hyperscan
    build (0.9.1 and 0.7.21 scan the running set at 2.5x different speeds:
    bench/hyperscan-sets-latest.txt) and whether the C line search and walk are built."""
    probe = ("import hyperscan, sglang_guard, sglang_guard.rules.linescan as l; "
             "print(getattr(hyperscan, '__version__', '?'), l.first_line is not None, "
             "getattr(l, 'advance', None) is not None, sglang_guard.__file__)")
    try:
        found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                               timeout=60, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        found = []
    if len(found) != 4:
        return "unknown"
    package = Path(found[3]).parent
    if not package.is_relative_to(REPO):  # an installed wheel: the commit it was built from
        stamp = package / "_build.txt"
        commit = (f"the wheel built at {stamp.read_text().strip()}" if stamp.exists()
                  else f"{package} (not this checkout; no build stamp)")
    else:
        commit = f"main {_commit()}"
    yes = {"True": "yes", "False": "no"}
    return (f"{commit}; hyperscan {found[0]}; C line search {yes.get(found[1], '?')}, "
            f"walk {yes.get(found[2], '?')}")


def _commit() -> str:
    """This checkout's commit (`?` without git or a .git)."""
    try:  # a copy without its .git (the H200 host's) has no commit to name
        commit = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse",
                                 "--short", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=False).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    return commit


def table(figures: list[Figure]) -> str:
    """The figures as a fixed-width table."""
    head = ("figure", "unit", "guard min/med/max", "peer min/med/max", "peer", "ratio", "target")
    rows = [head]
    for f in figures:
        ratio = f.ratio()
        verdict = "" if f.met is None else (" met" if f.met else " MISSED")
        rows.append((f.name, f.unit, spread(f.guard), spread(f.peer), f.peer_name,
                     "-" if ratio is None else f"{ratio:.2f}x", (f.target + verdict).strip()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  {f.name}: {f.note}" for f in figures if f.note]
    return "\n".join(lines + (["notes:", *dict.fromkeys(notes)] if notes else []))


def main() -> int:
    """Parse, install the peers, measure, print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--lines", default="1000000,4000000",
                    help="pass-through sizes, comma-separated line counts")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    ap.add_argument("--no-crash-loop", action="store_true", help="skip the 45 s/run crash loop")
    ap.add_argument("--fresh-peers", action="store_true",
                    help="install the peers into a temp dir instead of the cache")
    args = ap.parse_args()
    sections = [s for s in args.only.split(",") if s]
    if unknown := set(sections) - set(SECTIONS):
        ap.error(f"unknown sections: {sorted(unknown)} (choose from {SECTIONS})")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sglang-guard-bench-") as t:
        tmp = Path(t)
        peers = peer_env.ensure(tmp / "peers" if args.fresh_peers else None)
        header = [f"# sglang-guard bench/run, {time.strftime('%Y-%m-%d %H:%M %Z')}",
                  f"# machine: {machine()}", f"# guard: {guard_build()}",
                  f"# peers: {peer_env.versions(peers)}; "
                  f"{args.runs} runs; ratio = median over runs of guard/peer"]
        print("\n".join(header), file=sys.stderr)
        figures: list[Figure] = []
        window = Window()
        sizes = [int(n) for n in args.lines.split(",") if n]
        runs = {
            "pass": lambda: pass_through.measure(tmp, peers, sizes, args.runs),
            "reaction": lambda: reaction.measure(tmp, peers, args.runs),
            "flood": lambda: flood.measure(tmp, peers, args.runs),
            "lifecycle": lambda: lifecycle.measure(tmp, peers, args.runs,
                                                   crash_loop=not args.no_crash_loop),
            "check": lambda: check.measure(tmp, max(args.runs, 5)),
        }
        try:
            for section in SECTIONS:
                if section in sections:
                    window.begin()
                    figures += runs[section]()
                    window.end(section)
        finally:
            kill_strays(str(tmp))  # whatever a failed run left behind
        elapsed = time.monotonic() - started
        print("\n".join([*header, f"# took {elapsed:.0f} s", window.line(), table(figures)]))
    if args.json:
        args.json.write_text(json.dumps([f.as_json() for f in figures], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
