"""Process helpers: a free port, waits on pids that never sleep, what is left of a group."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import select
import socket
import time
from pathlib import Path
from typing import Any

import psutil

from sglang_guard.supervise.shell.proctree import find_orphans

# Ports are picked below the kernel's ephemeral range (32768-60999 here), which it hands to
# every outgoing connection: a port picked there (bind to 0) can become SGLang's own
# connection to its TCP store in the ~10 s before its HTTP server binds it, as it did once in
# CI ("[Errno 98] error while attempting to bind ... address already in use" on the test's
# free-picked --port). 12000-21999: below that range, apart from the guard's own picks for a
# free_port fix (supervise/shell/ports.py, 22000-29999) and from the default ports no test
# may bind (9488, 9489, 30000).
_TEST_PORTS = range(12000, 22000)
_PICK_ATTEMPTS = 64
_handed: collections.deque[int] = collections.deque(maxlen=256)  # not handed out twice soon


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on `host` (TIME_WAIT counted as busy), below the kernel's ephemeral
    range where one is; another process may still take it later."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for port in random.sample(_TEST_PORTS, _PICK_ATTEMPTS):
        if port in _handed:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed.append(port)
        return port
    with socket.socket(family, socket.SOCK_STREAM) as sock:  # that range is full: the kernel's
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def survivors(pgid: int, pids: tuple[int, ...] | list[int] = ()) -> int:
    """How many processes are still alive in the group or session `pgid`, or among `pids`."""
    alive = set(find_orphans(pgid))
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.Error:
            pass
    return len(alive)



def wait_gone(pids: list[int], timeout: float = 10) -> list[int]:
    """Wait (on pidfds, no sleeping) until every pid has exited; returns the ones still alive.

    A zombie counts as gone: reaping it is its parent's business (PID 1 for orphans).
    """
    fds: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds[os.pidfd_open(pid)] = pid
    try:
        deadline = time.monotonic() + timeout
        while fds:
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            left = deadline - time.monotonic()
            ready = poller.poll(max(0.0, left) * 1000)
            for fd, _ in ready:
                os.close(fd)
                del fds[fd]
            if not ready and left <= 0:
                break
        return sorted(fds.values())
    finally:
        for fd in fds:
            os.close(fd)


def read_pidfile(path: Path) -> dict[str, Any]:
    """The JSON a fake child wrote with ["pidfile", path]."""
    info: dict[str, Any] = json.loads(path.read_text())
    return info

