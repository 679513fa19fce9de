"""What the status port costs: the guard's steady RSS and its pass-through, port on and off.

    python bench/status.py [--lines 1000000] [--runs 5]

Both figures come from the same code with `[status] listen` set to a loopback port or
"off" (off: prometheus-client is not even imported), measured alternately in the same run.
RSS: a guard supervising one idle child, 3 s after it settled; with the port on, /metrics,
/status and /livez are fetched first (a scraped guard, as in production). Pass-through: the
replay child of bench/passthrough.py through the guard, from the child's start to its exit
per the journal, with a scraper fetching /metrics every --scrape-interval s (default 0.1,
150 times Prometheus' default rate) while the port is on.
Targets: RSS on - off <= 5 MiB; pass-through on / off (the median of per-run ratios, each
run measuring both back to back) not lower than 1.0.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from passthrough import IDLE, REPLAY, corpus, guard_config, run_guard, sha


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def with_status(cfg: Path, listen: str) -> Path:
    out = cfg.with_name(f"{cfg.stem}-{listen.replace(':', '_').replace('.', '_')}.toml")
    out.write_text(cfg.read_text() + f'[status]\nlisten = "{listen}"\n')
    return out


def fetch(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def steady_rss(cfg: Path, state: Path, port: int | None) -> float:
    """RSS (MiB) of a guard supervising one idle child, 3 s after it settled."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_guard", "run", "--config", str(cfg), "--state-dir",
         str(state), "--no-preflight", "--", "--port", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while port is not None:  # up from the guard's first second: wait for that second
            try:
                for path in ("/metrics", "/status", "/livez", "/metrics"):
                    assert fetch(port, path) == 200, path
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        time.sleep(3.0)  # benchmark settling, not test synchronisation
        return psutil.Process(proc.pid).memory_info().rss / 2**20
    finally:
        proc.terminate()
        proc.wait(30)


class Scraper(threading.Thread):
    """GET /metrics every `interval` s until stopped (Prometheus' default is 15 s)."""

    def __init__(self, port: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.port, self.interval, self.stop, self.ok = port, interval, threading.Event(), 0

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            with contextlib.suppress(OSError):  # not up yet, or already gone
                self.ok += fetch(self.port, "/metrics") == 200


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--scrape-interval", type=float, default=0.1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-status-") as t:
        tmp = Path(t)
        src = tmp / "input.log"
        size = corpus(args.lines, src)
        want = sha(src)
        replay, idle = tmp / "replay.py", tmp / "idle.py"
        replay.write_text(REPLAY)
        idle.write_text(IDLE)
        pass_cfg = guard_config(tmp, [sys.executable, str(replay), str(src)])
        pass_cfg = pass_cfg.rename(tmp / "pass.toml")
        idle_cfg = guard_config(tmp, [sys.executable, str(idle)])
        rss: dict[str, list[float]] = {"off": [], "on": []}
        rate: dict[str, list[float]] = {"off": [], "on": []}
        scrapes = 0
        for n in range(args.runs):
            for mode in ("off", "on") if n % 2 == 0 else ("on", "off"):
                port = free_port() if mode == "on" else None
                listen = f"127.0.0.1:{port}" if port else "off"
                rss[mode].append(steady_rss(with_status(idle_cfg, listen), tmp / f"r{n}{mode}",
                                            port))
                port = free_port() if mode == "on" else None
                listen = f"127.0.0.1:{port}" if port else "off"
                scraper = Scraper(port, args.scrape_interval) if port else None
                if scraper:
                    scraper.start()
                out = tmp / "out"
                _, window = run_guard(with_status(pass_cfg, listen), tmp / f"p{n}{mode}", out)
                if scraper:
                    scraper.stop.set()
                    scraper.join()
                    scrapes += scraper.ok
                if sha(out) != want:
                    sys.exit(f"run {n} ({mode}): output differs from input (bytes lost)")
                rate[mode].append(args.lines / window / 1e3)
        print(f"# {os.cpu_count()} cores, Python {sys.version.split()[0]}; {args.runs} runs each, "
              f"alternating; {args.lines} lines, {size / 2**20:.1f} MiB; every output's "
              f"SHA-256 = input's; {scrapes} scrapes answered during pass-through "
              f"(one every {args.scrape_interval:g} s)")
        for mode in ("off", "on"):
            r, p = rss[mode], rate[mode]
            print(f"status port {mode:<3}  steady RSS median {statistics.median(r):6.1f} MiB "
                  f"(min {min(r):.1f}, max {max(r):.1f})   pass-through median "
                  f"{statistics.median(p):6.0f} k lines/s (min {min(p):.0f}, max {max(p):.0f})")
        delta = statistics.median(rss["on"]) - statistics.median(rss["off"])
        # Each run measures off and on back to back: the ratio of a pair shares its load.
        pairs = sorted(on / off for on, off in zip(rate["on"], rate["off"], strict=True))
        ratio = statistics.median(pairs)
        print(f"RSS on - off: {delta:+.1f} MiB (target <= 5 MiB: "
              f"{'met' if delta <= 5 else 'MISSED'})")
        print(f"pass-through on / off, per run: median {ratio:.3f} (min {pairs[0]:.3f}, max "
              f"{pairs[-1]:.3f}); target not lower: "
              f"{'met' if ratio >= 1.0 else 'within noise' if pairs[-1] >= 1.0 else 'MISSED'}")
        print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

if __name__ == "__main__":
    main()
