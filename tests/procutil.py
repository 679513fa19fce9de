"""Helpers the process-level tests share: a free port, and what is left of a process group."""

from __future__ import annotations

import socket

import psutil

from sglang_guard.shell.proctree import find_orphans


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free now (another process may take it later)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
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
