"""The calling thread's name as the kernel shows it: `top -H`, `ps -L`, py-spy and
/proc/<pid>/task/<tid>/comm then say which of the guard's threads takes the CPU.

CPython before 3.14 leaves every thread named after the process ("python3"). The kernel
keeps 15 bytes of a name; `name_this_thread` keeps the most telling ones. Elsewhere than
Linux, or where /proc is not mounted, nothing happens.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

COMM_BYTES = 15  # TASK_COMM_LEN 16, with its NUL


def native_name(name: str) -> str:
    """`name` as the kernel keeps it: at most 15 bytes of ASCII."""
    return name.encode("ascii", "replace")[:COMM_BYTES].decode("ascii")


def name_this_thread(name: str) -> None:
    """Name the calling thread (not the process: never call it from the main thread)."""
    with contextlib.suppress(OSError):
        Path("/proc/thread-self/comm").write_text(native_name(name))
