"""Fixtures for every tier (registered by tests/conftest.py): processes, servers, the pack.

`default_ports_held` holds the guard's default ports (9488, 9489) on loopback for the whole
session, as another guard on a shared host would: a test that needs them cannot pass.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from sglang_guard.config.guardconfig import DEFAULT_GROUP_PORT, DEFAULT_STATUS_PORT
from sglang_guard.supervise.events import Event
from sglang_guard.supervise.shell.child import Child

from .children import FAKE, fake_argv
from .guards import Guard, GuardRun
from .harness import HealthServer
from .pack import write_pack
from .procs import read_pidfile

DEFAULT_PORTS = (DEFAULT_STATUS_PORT, DEFAULT_GROUP_PORT)


class PortHolder:
    """Holds 127.0.0.1:PORT for each default port, as another guard on this host would."""

    def __init__(self, ports: tuple[int, ...]) -> None:
        self.ports = ports
        self._held: dict[int, socket.socket] = {}
        self.ensure()

    def ensure(self) -> None:
        """Listen on every port not held yet; one that another process listens on is held
        already (by it), just as well."""
        for port in self.ports:
            if port in self._held:
                continue
            sock = socket.socket()
            # Past connections in TIME_WAIT must not pass for a listener.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
                sock.listen()
            except OSError as exc:
                sock.close()
                if exc.errno != errno.EADDRINUSE:
                    raise
                continue
            self._held[port] = sock

    def close(self) -> None:
        """Let go of every port held."""
        for sock in self._held.values():
            sock.close()
        self._held.clear()


@pytest.fixture(scope="session", autouse=True)
def default_ports_held() -> Iterator[PortHolder]:
    """127.0.0.1:9488 and :9489 held for the whole session: a test that needs them fails."""
    holder = PortHolder(DEFAULT_PORTS)
    try:
        yield holder
    finally:
        holder.close()


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves a thread running (after giving each 5 s to finish).

    Tiers that start real processes and threads make it autouse in their conftest.
    """
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before]
    for thread in leaked:
        thread.join(5)
    alive = [t.name for t in leaked if t.is_alive()]
    assert not alive, f"leaked threads: {alive}"


@pytest.fixture
def events() -> queue.Queue[Event]:
    """The event queue a Child puts on."""
    return queue.Queue()


@pytest.fixture
def spawn(events: queue.Queue[Event]) -> Iterator[Callable[..., Child]]:
    """Spawn fake children (BytesIO sinks unless given); stops whatever is left at the end."""
    children: list[Child] = []

    def start(*steps: list[Any], **kwargs: Any) -> Child:
        kwargs.setdefault("stdout_sink", io.BytesIO())
        kwargs.setdefault("stderr_sink", io.BytesIO())
        child = Child.spawn(fake_argv(*steps), gen=kwargs.pop("gen", 1), events=events, **kwargs)
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None or not child.join(0):
            child.stop(0.0, timeout=10)


@pytest.fixture
def pidfile(tmp_path: Path) -> Iterator[Path]:
    """A path for ["pidfile", ...]; every fake process it names is killed afterwards."""
    path = tmp_path / "pids.json"
    yield path
    if not path.exists():
        return
    info = read_pidfile(path)
    for pid in [info["pid"], *info["children"]]:
        with contextlib.suppress(psutil.Error):
            if str(FAKE) in psutil.Process(pid).cmdline():
                os.kill(pid, signal.SIGKILL)



@pytest.fixture
def server() -> Iterator[HealthServer]:
    """The HTTP health endpoints the guard probes."""
    with HealthServer() as srv:
        yield srv



@pytest.fixture
def pack(tmp_path: Path) -> Path:
    """The test rule pack, as a file the guard config names."""
    return write_pack(tmp_path)


@pytest.fixture
def guard(tmp_path: Path) -> Iterator[Guard]:
    """Start `sglang-guard run`; whatever is left of it is killed at the end."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(config: Path, argv: list[str], *, state_dir: Path | None = None
              ) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "sglang_guard", "run", "--config", str(config),
               "--state-dir", str(state_dir or tmp_path / "state"), "--no-preflight",
               "--", *argv]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, cwd=tmp_path)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                for kid in psutil.Process(proc.pid).children(recursive=True):
                    kid.kill()
            proc.kill()
        proc.communicate(timeout=30)


STDERR_TAIL = 40  # lines of each guard's stderr a failed test shows


@pytest.fixture
def start_guard(tmp_path: Path) -> Iterator[type[GuardRun]]:
    """Start guards with `start_guard(tmp, config, argv, state)`; killed at the end if left.

    Each guard's last stderr lines are printed at teardown: pytest shows them under a failed
    test only, and they go with the test's tmp dir otherwise (a guard that never got ready
    says why there)."""
    runs: list[GuardRun] = []

    class Tracked(GuardRun):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            runs.append(self)

    yield Tracked
    for n, run in enumerate(runs):
        run.kill()
        with contextlib.suppress(OSError):
            tail = run.stderr_path.read_text(errors="replace").splitlines()[-STDERR_TAIL:]
            print(f"--- guard {n + 1}'s stderr, last {len(tail)} lines ---", *tail, sep="\n")
