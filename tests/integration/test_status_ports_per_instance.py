"""Issue 22, item 3: two guards on one host each serve their own status port, unconfigured.

The default (`[status] listen = "auto"`) derives the port from SGLang's --port; when that is
taken (here: both guards run the same --port), the second takes any free port and says so:
the journal's status.listening, `status-address` in its state dir.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_guard.config.guardconfig import DEFAULT_GROUP_PORT, DEFAULT_STATUS_PORT, derived_port
from sglang_guard.errors import EXIT_OK
from sglang_guard.status.shell.status import ADDRESS_FILE, sglang_port
from support.guards import guard_toml
from support.harness import (
    HealthServer,
    Launcher,
    base_argv,
    journal_events,
    ready_then_wait,
    wait_for,
)
from support.pack import PACK_TEXT
from support.statusport import get


def _past_preflight(address: tuple[str, int]) -> tuple[int, bytes] | None:
    """/status's answer once the guard's phase has left "preflight" (None before)."""
    code, body = get(address, "/status")
    return (code, body) if code != 200 or json.loads(body)["phase"] != "preflight" else None


def test_two_guards_on_one_host_each_serve_their_own_status_port(tmp_path: Path) -> None:
    with HealthServer() as health:
        if derived_port(DEFAULT_STATUS_PORT, health.port) == DEFAULT_STATUS_PORT:
            pytest.skip("the free port picked derives the fixed default, which tests never bind")
        procs, states = [], []
        try:
            for name in ("a", "b"):
                root = tmp_path / name
                root.mkdir()
                pack = root / "rules.toml"
                pack.write_text(PACK_TEXT)
                config = guard_toml(root, Launcher(root, [ready_then_wait()]), pack, status=None)
                assert "[status]" not in config.read_text()  # nothing configured
                state = root / "state"
                states.append(state)
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "sglang_guard", "run", "--config", str(config),
                     "--state-dir", str(state), "--no-preflight", "--",
                     *base_argv(health.port)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                    env={k: v for k, v in os.environ.items()
                         if not k.startswith("SGLANG_GUARD_STATUS")}))
            addresses = []
            for proc, state in zip(procs, states, strict=True):
                wait_for(lambda s=state: (s / ADDRESS_FILE).is_file(), what="status-address")
                doc = json.loads((state / ADDRESS_FILE).read_text())
                assert doc["pid"] == proc.pid
                (rec,) = [r for r in journal_events(state) if r["event"] == "status.listening"]
                assert (rec["host"], rec["port"]) == (doc["host"], doc["port"])
                addresses.append((doc["host"], doc["port"]))
            assert addresses[0] != addresses[1]
            assert derived_port(DEFAULT_STATUS_PORT, health.port) in {p for _, p in addresses}
            for address in addresses:
                # The port listens before the first launch: on a loaded host the phase may
                # still read "preflight" here (seen once in CI); wait for the launch.
                code, body = wait_for(lambda a=address: _past_preflight(a), what="a launch")
                assert code == 200 and json.loads(body)["phase"] in ("starting", "ready")
                assert json.loads(body)["listen"] == {"host": address[0], "port": address[1]}
                assert get(address, "/livez")[0] == 200
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                _, err = proc.communicate(timeout=30)
                assert proc.returncode == EXIT_OK, err
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def test_derived_ports() -> None:
    assert derived_port(DEFAULT_STATUS_PORT, 30000) == DEFAULT_STATUS_PORT  # SGLang's default
    assert derived_port(DEFAULT_STATUS_PORT, 30001) == DEFAULT_STATUS_PORT + 2
    assert derived_port(DEFAULT_GROUP_PORT, 20000) == DEFAULT_GROUP_PORT
    assert derived_port(DEFAULT_GROUP_PORT, 20001) == DEFAULT_GROUP_PORT + 2
    status = {derived_port(DEFAULT_STATUS_PORT, p) for p in range(30000, 30500)}
    group = {derived_port(DEFAULT_GROUP_PORT, p) for p in range(20000, 20500)}
    assert len(status) == len(group) == 500 and not status & group
    assert sglang_port(["--model-path", "m"]) == 30000
    assert sglang_port(["--port", "31000", "--port=31002"]) == 31002
