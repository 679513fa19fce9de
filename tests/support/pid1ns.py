"""PID namespaces for tests of the guard as PID 1: whether unshare may make one, zombies."""

from __future__ import annotations

import os
import shutil
import subprocess

import psutil
import pytest


def unshare_works() -> bool:
    """unshare is there and may make a PID namespace (root, or user namespaces allowed)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, check=False)
    return probe.returncode == 0


# Under CI (root on a machine that allows it) the PID-1 tests must run: no skip there.
needs_unshare = pytest.mark.skipif(not unshare_works() and not os.environ.get("CI"),
                                   reason="unshare --pid --fork --mount-proc is not allowed here")


def zombies(pid1: psutil.Process) -> list[psutil.Process]:
    """Zombies in the namespace: children of PID 1 or of anything below it."""
    out = []
    with_children = [pid1, *pid1.children(recursive=True)]
    for proc in with_children:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.NoSuchProcess:
            continue
    return out
