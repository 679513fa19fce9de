"""A thread's time slice under Linux's fair scheduler (EEVDF, Linux 6.12 and later).

A pipe's write wakes its reader "sync" (the writer is expected to wait soon): the kernel
puts the reader on the writer's own CPU unless the reader's last CPU is idle. There, with
the default slice, the reader waits until the writer blocks or its slice runs out. Since
Linux 6.12 a SCHED_OTHER thread may ask for a shorter slice (`sched_setattr`'s
`sched_runtime`, clamped to 0.1-100 ms; no privilege needed): its earlier deadline lets it
preempt the writer on wake-up (the kernel's PREEMPT_SHORT), where the slice asked for is
shorter than the writer's. Older kernels ignore the field for such a thread; nothing here
ever raises, and where the kernel did not take the slice the answer says so.

Measured on a 2-core VM (Linux 6.18; bench/README.md, "The idle reaction: the reader's
slice"): a process that runs on after its pipe write (as SGLang's scheduler does after its
fatal traceback) held its reader off for 0.76 ms median (q3 2.4 ms) with the default slice
and 0.14 ms (q3 0.15) with a 0.1 ms one.
"""

from __future__ import annotations

import ctypes
import os
import sys
from functools import cache
from typing import Any

SHORTEST_NS = 100_000  # the kernel's lower clamp of a requested slice (0.1 ms)
_SCHED_OTHER, _SCHED_BATCH = 0, 3  # the fair policies; others (RT, deadline, idle) are left alone
# (sched_setattr, sched_getattr): <asm/unistd_64.h>; aarch64 takes asm-generic's numbers.
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}


class _Attr(ctypes.Structure):
    """`struct sched_attr`, SCHED_ATTR_SIZE_VER0 (48 bytes: no utilization clamps)."""

    _fields_ = [("size", ctypes.c_uint32), ("policy", ctypes.c_uint32),
                ("flags", ctypes.c_uint64), ("nice", ctypes.c_int32),
                ("priority", ctypes.c_uint32), ("runtime", ctypes.c_uint64),
                ("deadline", ctypes.c_uint64), ("period", ctypes.c_uint64)]


def _machine() -> str:
    """The CPU architecture as the kernel names it (`platform.machine`'s answer here, with no
    import of `platform` on the run path)."""
    return os.uname().machine


@cache
def _syscall() -> tuple[Any, int, int] | None:
    """libc's `syscall` and this machine's (sched_setattr, sched_getattr) numbers."""
    numbers = _SYSCALLS.get(_machine()) if sys.platform.startswith("linux") else None
    if numbers is None:
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_long
    return call, numbers[0], numbers[1]


def _fair(tid: int) -> _Attr | None:
    """Thread `tid`'s attributes where it runs on a fair policy; None otherwise, or where
    they cannot be read."""
    found = _syscall()
    if found is None:
        return None
    call, _, getattr_nr = found
    attr = _Attr()
    if call(ctypes.c_long(getattr_nr), ctypes.c_long(tid), ctypes.byref(attr),
            ctypes.c_uint(ctypes.sizeof(attr)), ctypes.c_uint(0)) != 0:
        return None
    return attr if attr.policy in (_SCHED_OTHER, _SCHED_BATCH) else None


def slice_ns(tid: int = 0) -> int | None:
    """The slice thread `tid` (0: the calling one) runs with, in ns; None where the kernel
    does not say (before 6.12 it reads 0 for a fair thread; not Linux)."""
    attr = _fair(tid)
    return int(attr.runtime) if attr is not None and attr.runtime else None


def set_slice(ns: int, tid: int = 0) -> bool:
    """Ask for a slice of `ns` (SHORTEST_NS or more; 0: the kernel's default again) for
    thread `tid` (0: the calling one; another of this process's threads by its native
    id), its policy and nice value kept. Whether the kernel took it: for `ns`, it now
    reports that slice (not before 6.12); for 0, the call succeeded. A thread on a policy
    other than a fair one is left as it is (False)."""
    found, attr = _syscall(), _fair(tid)
    if found is None or attr is None:
        return False
    call, setattr_nr, _ = found
    attr.size = ctypes.sizeof(attr)
    attr.runtime = ns
    if call(ctypes.c_long(setattr_nr), ctypes.c_long(tid), ctypes.byref(attr),
            ctypes.c_uint(0)) != 0:
        return False
    if not ns:
        return True
    now = _fair(tid)
    return now is not None and now.runtime == ns
