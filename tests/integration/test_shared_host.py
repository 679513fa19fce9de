"""Tests share a host: the suite runs while the guard's default ports are held (as another
guard on a developer's box or a shared CI runner holds them), and passes.

support/fixtures.py's `default_ports_held` holds them for the whole session; these tests
check that it does, and that a guard the harness starts goes elsewhere.
"""

from __future__ import annotations

import errno
import json
import signal
import socket
from pathlib import Path

import pytest

from sglang_guard.errors import EXIT_OK
from support.fixtures import PortHolder
from support.guards import Guard, argv_for, finish, guard_toml
from support.harness import HealthServer, Launcher, count, ready_then_wait, wait_for


@pytest.mark.parametrize("port", [9488, 9489])
def test_the_default_port_is_held_while_the_suite_runs(
        default_ports_held: PortHolder, port: int) -> None:
    assert port in default_ports_held.ports
    default_ports_held.ensure()  # another holder may have let go since the session began
    with socket.socket() as sock, pytest.raises(OSError) as exc:
        sock.bind(("127.0.0.1", port))
    assert exc.value.errno == errno.EADDRINUSE


def test_a_harness_guard_serves_its_status_on_a_port_of_its_own(
        tmp_path: Path, pack: Path, guard: Guard, server: HealthServer,
        default_ports_held: PortHolder) -> None:
    launcher = Launcher(tmp_path, [ready_then_wait()])
    proc = guard(guard_toml(tmp_path, launcher, pack), argv_for(server.port))
    wait_for(lambda: count(tmp_path / "state", "ready") >= 1, what="ready")
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == EXIT_OK, err
    logs = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    listening = [r for r in logs if r.get("event") == "status.listening"]
    assert len(listening) == 1, err
    assert listening[0]["port"] not in default_ports_held.ports
    assert not [r for r in logs if r.get("event") == "status.unavailable"]
