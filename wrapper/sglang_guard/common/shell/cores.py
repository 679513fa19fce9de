"""How many CPU cores this process may run on: its affinity, capped by a cgroup's CPU quota.

A container limited to two CPUs (Kubernetes `resources.limits.cpu: 2`, `docker --cpus 2`)
sees every core of its host in its affinity mask; its cgroup's quota is what it gets. Only
cgroup v2 is read (`cpu.max` of the process's own cgroup and each one above it, the least
counting); v1 or no cgroup: the affinity.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def quota_cores(cpu_max: str) -> int | None:
    """The cores a cgroup v2 `cpu.max` ("QUOTA PERIOD", microseconds, or "max PERIOD")
    allows, rounded up (a quota of 1.5 CPUs runs on two cores at a time); None: no quota,
    or not that format."""
    fields = cpu_max.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def own_cgroup(proc_cgroup: str) -> str | None:
    """The cgroup v2 path in a `/proc/self/cgroup` text (its "0::/path" line); None: none."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def usable_cores(root: Path = _CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")
                 ) -> int:
    """The cores this process may use at once: its affinity (all cores where the platform
    has none), capped by its cgroup v2 CPU quota where one is set and readable."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        path = own_cgroup(proc_cgroup.read_text())
    except (OSError, ValueError):
        return cores
    if path is None:
        return cores
    group = root / path.strip("/")
    for where in (group, *group.parents):
        try:
            quota = quota_cores(where.joinpath("cpu.max").read_text())
        except (OSError, ValueError):
            quota = None
        if quota is not None:
            cores = min(cores, quota)
        if where == root:
            break
    return cores
