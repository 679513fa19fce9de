"""sd_notify against a real NOTIFY_SOCKET listener (path and abstract sockets)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_guard.supervise.shell.notify import Notifier


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


def test_sends_fields_to_a_path_socket(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    n = Notifier(path)
    assert n.enabled
    assert n.send("READY=1", "STATUS=ready")
    assert sock.recv(4096) == b"READY=1\nSTATUS=ready"
    n.close()


def test_abstract_socket() -> None:
    name = f"sglang-guard-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        n = Notifier("@" + name)
        assert n.send("WATCHDOG=1")
        assert sock.recv(4096) == b"WATCHDOG=1"
    finally:
        sock.close()


def test_no_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    n = Notifier()
    assert not n.enabled
    assert n.send("READY=1") is False


def test_dead_socket_does_not_raise(tmp_path: Path) -> None:
    assert Notifier(str(tmp_path / "gone.sock")).send("READY=1") is False
