"""The real supervisor, the shipped packs, and a fake SGLang that binds its ports as SGLang does.

The fake child binds the nccl port (or the --dist-init-addr port) on every address, as
torch's TCPStore does; when the bind fails it prints what SGLang 0.5.23 printed on CPU with a
busy --nccl-port (the scheduler's traceback, torch's DistNetworkError line with the port) and
dies. The test holds the port with a listening socket on 127.0.0.1, as another process would.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from requestlines import TS
from sglang_guard.errors import EXIT_GIVE_UP, EXIT_OK, GiveUp
from sglang_guard.rules.rules import Matcher, load_default_packs
from sglang_guard.supervise import machine
from sglang_guard.supervise.events import SignalReceived
from sglang_guard.supervise.shell.supervisor import Supervisor
from support.harness import (
    HealthServer,
    Launcher,
    base_argv,
    count,
    journal_events,
    make_runtime,
    supervise,
    wait_for,
)

TCPSTORE = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any "
            "local network address. port: {port}, useIpv6: false, code: -98, name: EADDRINUSE, "
            "message: address already in use")
# A fake SGLang: record the argv, bind the TCPStore's port, fail as SGLang does or serve.
BINDER = """
import json, os, signal, socket, sys
argv = sys.argv[1:]
with open({record!r}, "a") as fh:
    fh.write(json.dumps(argv) + "\\n")
def value(flag):
    return argv[argv.index(flag) + 1] if flag in argv else None
signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
addr = value("--dist-init-addr")
port = int(addr.rsplit(":", 1)[1]) if addr else int(value("--nccl-port") or 0)
err = lambda text: print(text, file=sys.stderr, flush=True)
err({ts!r} + " Init parallel begin.")
store = socket.socket()
store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    store.bind(("", port))
    store.listen()
except OSError:
    err({ts!r} + " Scheduler hit an exception: Traceback (most recent call last):")
    err('  File "torch/distributed/rendezvous.py", line 215, in _create_c10d_store')
    err('    return TCPStore(')
    err({tcpstore!r}.format(port=port))
    err("")
    err({ts!r} + " Received sigquit from a child process. It usually means the child failed.")
    sys.exit(137)
print({ready!r}, flush=True)
signal.sigwait({{signal.SIGTERM}})
"""


class Binder(Launcher):
    """The harness's Launcher (support/harness.py), running BINDER instead of a script."""

    def __post_init__(self) -> None:
        self.record = self.tmp / "argv.jsonl"
        script = self.tmp / "binder.py"
        script.write_text(BINDER.format(record=str(self.record), ts=TS, tcpstore=TCPSTORE,
                                        ready=f"{TS} {machine.READY_LINE}"))
        self.command = [sys.executable, str(script)]


@contextmanager
def held_port() -> Iterator[int]:
    """A port another process listens on, on loopback only."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _runtime(tmp_path: Path, **restart: Any) -> Any:
    launcher = Binder(tmp_path, [])
    rt = make_runtime(tmp_path, launcher, **restart)
    rt.env = replace(rt.env, matcher=Matcher(load_default_packs()), sglang_version="0.5.23")
    return rt, launcher


def test_a_busy_nccl_port_relaunches_on_a_free_one_and_serves(tmp_path: Path) -> None:
    rt, launcher = _runtime(tmp_path, max_failures=3)
    state = tmp_path / "state"
    with HealthServer() as server, held_port() as busy:
        argv = base_argv(server.port, "--nccl-port", str(busy))
        seen: dict[str, Any] = {}

        def during(sup: Supervisor) -> None:
            wait_for(lambda: count(state, "ready") >= 1, 60, "ready after the fix")
            picked = int(_value(launcher.argvs()[-1], "--nccl-port") or 0)
            with socket.socket() as probe:  # the relaunch bound it: not free for us now
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("", picked))
                    seen["held_by_child"] = False
                except OSError:
                    seen["held_by_child"] = True
            sup.events.put(SignalReceived(signal.SIGTERM))

        code = supervise(rt, argv, during)
    assert code == EXIT_OK
    first, second = launcher.argvs()
    assert first == argv
    picked = _value(second, "--nccl-port")
    assert picked is not None and picked.isdigit() and int(picked) != busy
    # Only --nccl-port changed: the HTTP --port clients use is the same.
    assert [a for a in second if a != picked] == [a for a in argv if a != str(busy)]
    assert seen["held_by_child"], "the relaunch did not bind the port it was given"
    records = journal_events(state)
    [fix] = [r for r in records if r["event"] == "remediated"]
    assert (fix["rule"], fix["flag"], fix["action"]) == ("nccl-port-in-use", "--nccl-port",
                                                         "set_flag")
    assert (fix["old_value"], fix["new_value"]) == (str(busy), picked)
    assert fix["busy_port"] == busy and fix["free_port"] is True
    assert fix["line"] == TCPSTORE.format(port=busy) and fix["gen"] == 1
    assert fix["argv_after"] == second
    assert [r["event"] for r in records].count("child.start") == 2
    assert not [r for r in records if r["event"] in ("give_up", "backoff", "crash.detected")]


def test_a_busy_dist_init_addr_port_gives_up_with_one_launch(tmp_path: Path) -> None:
    rt, launcher = _runtime(tmp_path, max_failures=3)
    with held_port() as busy:
        argv = base_argv(1, "--dist-init-addr", f"127.0.0.1:{busy}", "--nnodes", "1")
        code = supervise(rt, argv)
    assert code == EXIT_GIVE_UP
    assert len(launcher.argvs()) == 1
    records = journal_events(tmp_path / "state")
    [planned] = [r for r in records if r["event"] == "give_up.planned"]
    assert planned["rule"] == "dist-init-addr-port-in-use"
    assert f"({busy}," in planned["reason"] and "every node" in planned["reason"]
    assert not [r for r in records if r["event"] == "remediated"]


def test_the_http_port_in_use_is_never_moved(tmp_path: Path) -> None:
    rt, launcher = _runtime(tmp_path, max_failures=3)
    with held_port() as busy, pytest.raises(GiveUp) as gave_up:
        supervise(rt, ["--model-path", "/m", "--host", "127.0.0.1", "--port", str(busy)])
    assert gave_up.value.exit_code == EXIT_GIVE_UP
    assert launcher.argvs() == []  # checked before the launch: nothing started
    records = journal_events(tmp_path / "state")
    assert not [r for r in records if r["event"] == "remediated"]
    [gave] = [r for r in records if r["event"] == "give_up"]
    assert f"port {busy}" in gave["reason"] and "--port" in gave["reason"]


def test_the_journal_is_json_with_the_port_numbers(tmp_path: Path) -> None:
    """The chosen number is in the journal as written (not only in memory)."""
    rt, launcher = _runtime(tmp_path, max_failures=3)
    state = tmp_path / "state"
    with HealthServer() as server, held_port() as busy:
        def during(sup: Supervisor) -> None:
            wait_for(lambda: count(state, "ready") >= 1, 60, "ready")
            sup.events.put(SignalReceived(signal.SIGTERM))

        assert supervise(rt, base_argv(server.port, "--nccl-port", str(busy)), during) == EXIT_OK
    raw = [json.loads(line) for line in (state / "journal.jsonl").read_text().splitlines()]
    [fix] = [r for r in raw if r["event"] == "remediated"]
    assert fix["new_value"] == _value(launcher.argvs()[1], "--nccl-port")
