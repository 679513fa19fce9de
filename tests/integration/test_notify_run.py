"""systemd's notify protocol end to end: a real NOTIFY_SOCKET listener and a real guard.

READY=1 must come only after SGLang's ready line AND /health answering 200; while SGLang
loads, the guard says so in STATUS= and keeps the watchdog fed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sglang_guard.errors import EXIT_OK
from support.guards import finish, guard_toml
from support.harness import HealthServer, Launcher, count, ready_then_wait, wait_for
from support.notify import Listener


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


def test_sglang_never_sees_the_notify_socket_and_the_stop_says_stopping(
        tmp_path: Path, pack: Path) -> None:
    launcher = Launcher(tmp_path, [ready_then_wait()])
    state, seen = tmp_path / "state", tmp_path / "child-env.json"
    # the fake SGLang, behind a first step that writes down the environment it was given
    dump = ("import json, os, sys; open(sys.argv[1], 'w').write(json.dumps(dict(os.environ)));"
            " os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")
    listener = Listener(tmp_path / "notify.sock")
    try:
        with HealthServer() as server:
            config = guard_toml(tmp_path, launcher, pack, max_failures=3)
            launch = [sys.executable, "-c", dump, str(seen), launcher.command[1]]
            config.write_text(config.read_text().replace(
                f"launch = {json.dumps(launcher.command)}", f"launch = {json.dumps(launch)}"))
            env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
                   "WATCHDOG_USEC": "300000", "WATCHDOG_PID": str(os.getpid())}
            proc = subprocess.Popen(
                [sys.executable, "-m", "sglang_guard", "run", "--config", str(config),
                 "--state-dir", str(state), "--no-preflight", "--",
                 "--model-path", "/m", "--port", str(server.port)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
            wait_for(lambda: "READY=1" in listener.fields(), what="READY=1")
            child_env = json.loads(seen.read_text())
            for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
                assert name not in child_env, name
            assert child_env["PATH"] == os.environ["PATH"]  # the rest is passed on
            proc.send_signal(signal.SIGTERM)
            code, _, _ = finish(proc)
            assert code == EXIT_OK
            fields = listener.fields()
            assert "STOPPING=1" in fields
            assert fields.index("STOPPING=1") > fields.index("READY=1")
    finally:
        listener.close()
