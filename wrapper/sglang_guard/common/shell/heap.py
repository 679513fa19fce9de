"""The guard's heap, handed back after one-off work: a steady RSS is what a fleet watches."""

from __future__ import annotations

import contextlib
import ctypes


def trim_heap() -> None:
    """Hand the heap's free pages back to the kernel (glibc's malloc_trim).

    Compiling the block scan (rules/blockscan.py) takes ~11 MiB that the guard would keep
    for good otherwise, about 6 MiB of it free afterwards. Elsewhere (musl, macOS) nothing
    happens.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


_M_ARENA_MAX = -8  # <malloc.h>


def share_one_arena() -> bool:
    """Have every thread allocate from glibc's main arena (mallopt M_ARENA_MAX = 1), before
    the run starts its threads; whether it took (False elsewhere: musl, macOS).

    glibc gives each thread that mallocs an arena of its own. The pumps' threads allocate
    their chunks (a read's worth each) there, and after a 200 MB start-up flood malloc_trim
    left ~1.2 MiB of them resident: steady RSS after the flood 36.8-37.6 MiB against
    35.9-36.1 with one arena, the same as idle (256 KiB reads then; 2-core Intel Xeon VM, 3
    runs each; bench/README.md, "The log path, thirteenth round").
    """
    with contextlib.suppress(OSError, AttributeError):
        return bool(ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 1))
    return False
