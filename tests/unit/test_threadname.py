"""The guard's threads named as the kernel shows them (common/shell/threadname.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sglang_guard.common.shell.threadname import COMM_BYTES, name_this_thread, native_name

pytestmark = pytest.mark.skipif(not Path("/proc/thread-self/comm").exists(),
                                reason="the kernel's thread names are read from /proc")


@pytest.mark.parametrize(("name", "kept"), [
    ("g1-stdout-scan", "g1-stdout-scan"),
    ("g1-stderr-write", "g1-stderr-write"),  # 15 bytes: all of it
    ("g123-stdout-scan", "g123-stdout-sca"),  # the kernel's 15
    ("gé-x", "g?-x"),  # ASCII only: a name is bytes there
])
def test_the_name_the_kernel_keeps(name, kept):
    assert native_name(name) == kept
    assert len(native_name(name).encode()) <= COMM_BYTES


def test_a_thread_names_itself_and_not_the_process():
    process_name = Path("/proc/self/comm").read_text()
    seen: list[str] = []

    def work() -> None:
        name_this_thread("g9-stdout-scan")
        seen.append(Path("/proc/thread-self/comm").read_text())

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == ["g9-stdout-scan\n"]
    assert Path("/proc/self/comm").read_text() == process_name
