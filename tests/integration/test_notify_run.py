"""systemd's notify protocol end to end: a real NOTIFY_SOCKET listener and a real guard.

READY=1 must come only after SGLang's ready line AND /health answering 200; while SGLang
loads, the guard says so in STATUS= and keeps the watchdog fed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from sglang_guard.errors import EXIT_OK
from support.guards import finish, guard_toml
from support.harness import HealthServer, Launcher, count, ready_then_wait, wait_for


class Listener:
    """A NOTIFY_SOCKET: collects every datagram with the time it arrived."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.messages.append((time.monotonic(), data.decode()))

    def fields(self) -> list[str]:
        return [f for _, m in self.messages for f in m.split("\n")]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def test_ready_only_after_health_200_status_and_watchdog(tmp_path: Path, pack: Path) -> None:
    launcher = Launcher(tmp_path, [ready_then_wait()])
    state = tmp_path / "state"
    listener = Listener(tmp_path / "notify.sock")
    try:
        with HealthServer() as server:
            server.status["/health"] = 503  # SGLang's answer while it is still starting
            config = guard_toml(tmp_path, launcher, pack, max_failures=3)
            env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
                   "WATCHDOG_USEC": "300000"}
            proc = subprocess.Popen(
                [sys.executable, "-m", "sglang_guard", "run", "--config", str(config),
                 "--state-dir", str(state), "--no-preflight", "--",
                 "--model-path", "/m", "--port", str(server.port)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
            # The ready line was printed and /health asked (twice: 503 is retried) ...
            wait_for(lambda: server.hits.get("/health", 0) >= 2, what="/health probed twice")
            assert "READY=1" not in listener.fields()  # ... but 503 is not ready
            assert any(f.startswith("STATUS=loading") for f in listener.fields())
            wait_for(lambda: "WATCHDOG=1" in listener.fields(), what="watchdog while loading")
            server.status["/health"] = 200
            opened = time.monotonic()
            wait_for(lambda: "READY=1" in listener.fields(), what="READY=1")
            ready_at = next(t for t, m in listener.messages if "READY=1" in m.split("\n"))
            assert ready_at >= opened
            assert count(state, "ready") == 1
            proc.send_signal(signal.SIGTERM)
            code, _, _ = finish(proc)
            assert code == EXIT_OK
            assert "STATUS=stopping" in listener.fields()
    finally:
        listener.close()
