"""A real Prometheus server (Debian's `prometheus` package) as the guard's scraper.

    with prometheus(tmp, target=("127.0.0.1", 9488)) as prom:
        prom.wait_for('sglang_guard_ready == 1', timeout=300)

Not the Debian service: the binary, on loopback, with a temp config (1 s scrape interval)
and a temp TSDB, in its own session; stopped (TERM, then KILL) when the block ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .server import free_port

BINARY = "prometheus"


def find_binary() -> str | None:
    """The prometheus binary (Debian installs /usr/bin/prometheus)."""
    return shutil.which(BINARY) or next(
        (p for p in ("/usr/bin/prometheus", "/usr/sbin/prometheus") if Path(p).is_file()), None)


class Prometheus:
    """A running Prometheus: its HTTP API on `port`."""

    def __init__(self, binary: str, root: Path, target: tuple[str, int]) -> None:
        self.port = free_port()
        config = root / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: sglang-guard\n    scrape_interval: 1s\n"
            "    scrape_timeout: 1s\n"
            f"    static_configs:\n      - targets: ['{target[0]}:{target[1]}']\n")
        self.log_path = root / "prometheus.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={root / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self._tick = threading.Event()  # never set: the poll interval

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now ([] when Prometheus is not up yet)."""
        url = (f"http://127.0.0.1:{self.port}/api/v1/query?"
               + urllib.parse.urlencode({"query": expr}))
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                answer = json.loads(resp.read())
        except OSError:
            return []
        assert answer.get("status") == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def wait_for(self, expr: str, timeout: float) -> list[dict[str, Any]]:
        """Poll until `expr` returns a non-empty vector; that vector."""
        deadline = time.monotonic() + timeout
        while True:
            if result := self.query(expr):
                return result
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}: "
                                     f"{self.log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus: no result for {expr!r} within {timeout} s; "
                                     f"targets: {self.targets()}")
            self._tick.wait(0.5)

    def targets(self) -> Any:
        """/api/v1/targets (for failure messages)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/targets",
                                        timeout=5) as resp:
                return json.loads(resp.read())["data"]["activeTargets"]
        except OSError as exc:
            return str(exc)

    def stop(self) -> None:
        """TERM (Prometheus flushes its TSDB), then KILL after 20 s."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._log.close()


@contextlib.contextmanager
def prometheus(binary: str, root: Path, target: tuple[str, int]) -> Iterator[Prometheus]:
    """A started Prometheus scraping `target`; stopped when the block ends."""
    root.mkdir(parents=True, exist_ok=True)
    prom = Prometheus(binary, root, target)
    try:
        yield prom
    finally:
        prom.stop()
