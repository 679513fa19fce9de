"""Stopping a process tree and finding leftovers, with real processes; and the port checks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from sglang_guard.errors import InputError
from sglang_guard.supervise.shell import proctree
from sglang_guard.supervise.shell.ports import port_is_free, wait_port_free
from sglang_guard.supervise.shell.proctree import (
    find_orphans,
    finish_stop,
    stop_tree,
    terminate_tree,
)
from support.children import collect, fake_argv, next_line
from support.procs import free_port, read_pidfile, survivors, wait_gone


def start_tree(spawn, events, pidfile, *, plain: int, setsid: int):
    """A SIGTERM-ignoring fake child with grandchildren, all running; returns (child, pids)."""
    child = spawn(
        ["ignore_term"],
        ["spawn", plain, False],
        ["spawn", setsid, True],
        ["pidfile", str(pidfile)],
        ["print", "stdout", "ready"],
        ["pause"],
    )
    # Each grandchild prints once it ignores SIGTERM: then the counts below are exact.
    for _ in range(plain + setsid + 1):
        next_line(events, lambda line: line.text == "ready" or line.text.startswith("gc-ready"))
    info = read_pidfile(pidfile)
    return child, [info["pid"], *info["children"]]


def test_stop_tree_kills_a_term_ignoring_tree_with_a_setsid_grandchild(spawn, events, pidfile):
    child, pids = start_tree(spawn, events, pidfile, plain=2, setsid=1)
    sessions = {os.getsid(pid) for pid in pids}
    assert sessions == {child.pgid, pids[-1]}  # the last grandchild left the session and group

    report = child.stop(grace=0.3)

    assert (report.terminated, report.killed, survivors(child.pgid, pids)) == (0, 4, 0)
    assert 0.3 <= report.seconds < 10
    assert wait_gone(pids, timeout=0) == []
    _, exited = collect(events)
    assert exited.returncode == -signal.SIGKILL
    with pytest.raises(psutil.NoSuchProcess):  # reaped by the child's own reaper, no zombie
        psutil.Process(child.pid)


def test_the_snapshot_read_from_proc_is_psutils_walk(spawn, events, pidfile):
    """One read of /proc/<pid>/stat per process finds what psutil's walk of the machine
    finds: the main process, its group, and the grandchild that left group and session."""
    child, pids = start_tree(spawn, events, pidfile, plain=2, setsid=1)
    try:
        fast = proctree._snapshot(child.pid, child.pgid)
        assert sorted(fast) == sorted(proctree._snapshot_psutil(child.pid, child.pgid))
        assert sorted(fast) == sorted(pids)
        assert os.getpid() not in fast
    finally:
        child.stop(grace=0.2)
    collect(events)


def test_the_walk_by_children_lists_finds_the_tree_the_table_finds(spawn, events, pidfile):
    """The children lists read before the SIGTERM find the main process and every
    descendant, the setsid grandchild too: what the whole table finds for this tree."""
    child, pids = start_tree(spawn, events, pidfile, plain=2, setsid=1)
    try:
        walked = proctree._descendants(child.pid)
        assert walked is not None
        assert sorted(p.pid for p in walked) == sorted(pids)
        assert sorted(p.pid for p in walked) == sorted(proctree._snapshot(child.pid, child.pgid))
        # `tree`, the supervisor's record of it: the same walk, the main process first, and
        # psutil's walk (monkeypatched: no children lists) finds the same.
        walk = [p.pid for p in proctree.tree(child.pid)]
        assert walk[0] == child.pid and sorted(walk) == sorted(pids)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(proctree, "_children", lambda _pid: None)
            assert sorted(p.pid for p in proctree.tree(child.pid)) == sorted(pids)
    finally:
        child.stop(grace=0.2)
    collect(events)


@pytest.mark.parametrize("walk", ["c", "python", "table-only"])
def test_a_setsid_grandchild_outlives_its_parents_sigterm_and_is_still_stopped(
        spawn, events, pidfile, monkeypatch, walk):
    """The main process dies at SIGTERM (its default action), so its setsid grandchild,
    outside the group and ignoring SIGTERM, is an orphan at once: it was found before the
    SIGTERM went out, and the stop SIGKILLs it; by the walk in C or in Python, or without
    children lists (monkeypatched off) by the table read first."""
    if walk == "c" and proctree._held_tree is None:
        pytest.skip("the C walk is not built here")
    if walk != "c":
        monkeypatch.setattr(proctree, "_held_tree", None)
    if walk == "table-only":
        monkeypatch.setattr(proctree, "_children", lambda _pid: None)
    child = spawn(["spawn", 1, True], ["pidfile", str(pidfile)], ["print", "stdout", "ready"],
                  ["pause"])
    for _ in range(2):
        next_line(events, lambda line: line.text == "ready" or line.text.startswith("gc-ready"))
    info = read_pidfile(pidfile)
    pids = [info["pid"], *info["children"]]
    assert os.getsid(pids[1]) == pids[1]

    stopping = terminate_tree(child.pid, child.pgid)
    assert sorted(h.pid for h in stopping.handles) == sorted(pids)
    report = finish_stop(stopping, grace=0.3)

    assert (report.terminated, report.killed, survivors(child.pgid, pids)) == (1, 1, 0)
    assert wait_gone(pids, timeout=0) == []
    collect(events)


# A tree with every shape the walk meets: children forked by three threads (each listed under
# the thread that forked it, the threads still alive), two children with a grandchild each,
# one of them in a session of its own, and a child that exited unreaped (a zombie).
_SHAPED_TREE = """
import os, sys, threading, time

def fork_sleep(setsid=False, grandchild=False):
    pid = os.fork()
    if pid == 0:
        if setsid:
            os.setsid()
        if grandchild and os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        time.sleep(60)
        os._exit(0)
    return pid

forked = threading.Barrier(4)
def by_a_thread():
    fork_sleep()
    forked.wait()
    time.sleep(60)
for _ in range(3):
    threading.Thread(target=by_a_thread, daemon=True).start()
forked.wait()
fork_sleep(grandchild=True)
fork_sleep(setsid=True, grandchild=True)
zombie = os.fork()
if zombie == 0:
    os._exit(0)
while open(f"/proc/{zombie}/stat").read().split(") ")[1][0] != "Z":
    time.sleep(0.01)
print(zombie, flush=True)
time.sleep(60)
"""


def _fdinfo_pid(fd: int) -> int:
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("Pid:"):
            return int(line.split()[1])
    raise AssertionError(f"fd {fd} is no pidfd")


@pytest.mark.skipif(proctree._held_tree is None and
                    os.environ.get("SGLANG_GUARD_REQUIRE_NATIVE") != "1",
                    reason="the C walk is not built here")
def test_the_c_walk_holds_what_the_python_walk_holds():
    """`_held_tree` (supervise/shell/_proctree.c) is `_walk` then `_open_walked`: the same
    pids in the same order (parents first) over children forked by several threads, a
    grandchild, a setsid grandchild, and not the zombie (its pidfd reads as exited); each
    pidfd names its process. A gone process and the guard itself hold nothing."""
    held_tree = proctree._held_tree
    assert held_tree is not None
    proc = subprocess.Popen([sys.executable, "-c", _SHAPED_TREE], start_new_session=True,
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    pairs: list[tuple[int, int]] = []
    try:
        zombie = int(proc.stdout.readline())
        since = proctree._now_ticks()
        walked = proctree._walk(proc.pid)
        assert walked is not None
        python = proctree._open_walked(walked, since)
        assert python is not None
        pairs = held_tree(proc.pid) or []
        want = [h.pid for h in python]
        for handle in python:
            handle.close()
        assert [p for p, _ in pairs] == want
        assert len(want) == 1 + 3 + 2 + 2 and zombie in walked and zombie not in want
        assert [_fdinfo_pid(fd) for _, fd in pairs] == want
        assert any(os.getsid(p) == p for p in want if p != proc.pid)  # the setsid one
    finally:
        for _, fd in pairs:
            os.close(fd)
        stop_tree(proc.pid, proc.pid, grace=0)
        proc.wait(10)
    assert held_tree(proc.pid) == []  # reaped: gone
    assert held_tree(os.getpid()) == []


def test_the_c_walk_is_built_where_it_is_required():
    """CI (.ci/run) sets SGLANG_GUARD_REQUIRE_NATIVE=1: a build that silently fell back to
    the Python walk fails here instead of only stopping later; SGLANG_GUARD_PURE=1 turns it
    off."""
    if os.environ.get("SGLANG_GUARD_REQUIRE_NATIVE") == "1":
        assert proctree._held_tree is not None
    probe = "from sglang_guard.supervise.shell import proctree; print(proctree._held_tree)"
    pure = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, env={**os.environ, "SGLANG_GUARD_PURE": "1"})
    assert pure.stdout.strip() == "None"


_ORPHAN_IN_SESSION = """
import os, signal, sys, time
r, w = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:
        os.setpgid(0, 0)
        os.write(w, b"%d\\n" % os.getpid())
        time.sleep(60)
        os._exit(0)
    os._exit(0)
os.wait()
print(os.read(r, 64).decode().strip(), flush=True)
time.sleep(60)
"""


def test_a_session_member_the_walk_cannot_reach_is_stopped_from_the_table():
    """A grandchild in its own group but the child's session, whose parent already exited:
    reparented, it is no descendant of the child and no member of its group, so neither the
    walk nor killpg reach it; `finish_stop` reads the whole table before its grace and finds
    it by its session: it gets its SIGTERM (and ends on it), not only the SIGKILL after the
    grace that the group's last sweep gives."""
    proc = subprocess.Popen([sys.executable, "-c", _ORPHAN_IN_SESSION], start_new_session=True,
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    orphan = int(proc.stdout.readline())
    try:
        assert (os.getsid(orphan), os.getpgid(orphan)) == (proc.pid, orphan)
        assert psutil.Process(orphan).ppid() != proc.pid
        stopping = terminate_tree(proc.pid, proc.pid)
        assert [h.pid for h in stopping.handles] == [proc.pid]  # the walk's find
        report = finish_stop(stopping, grace=10)
        assert (report.terminated, report.killed) == (2, 0)
        assert report.seconds < 5
        assert wait_gone([orphan], timeout=5) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)
        proc.kill()
        proc.wait(10)


def test_the_tree_of_a_gone_process_is_no_such_process():
    proc = subprocess.Popen(fake_argv(["exit", 0]), start_new_session=True)
    assert proc.wait(10) == 0
    with pytest.raises(psutil.NoSuchProcess):
        proctree.tree(proc.pid)


def test_terminate_tree_signals_at_once_and_finish_stop_does_the_rest():
    proc = subprocess.Popen(fake_argv(["pause"]), start_new_session=True)
    try:
        stopping = terminate_tree(proc.pid, proc.pid)
        assert proc.wait(10) == -signal.SIGTERM  # gone before anything waits on it
        report = finish_stop(stopping, grace=10)
        assert (report.terminated, report.killed, survivors(proc.pid)) == (1, 0, 0)
    finally:
        proc.kill()
        proc.wait(10)


def test_find_orphans_names_what_outlived_a_killed_main(spawn, events, pidfile):
    child, pids = start_tree(spawn, events, pidfile, plain=2, setsid=0)
    os.kill(child.pid, signal.SIGKILL)
    assert wait_gone([child.pid]) == []

    assert find_orphans(child.pgid) == sorted(pids[1:])

    # The grandchildren hold the pipes: no exit event until they are gone too.
    assert events.empty()
    report = child.stop(grace=0.2)
    assert (report.killed, survivors(child.pgid, pids)) == (2, 0)
    _, exited = collect(events)
    assert exited.returncode == -signal.SIGKILL
    assert find_orphans(child.pgid) == []


def test_stop_tree_leaves_the_exit_status_to_the_popen_that_owns_it():
    proc = subprocess.Popen(fake_argv(["pause"]), start_new_session=True)
    try:
        report = stop_tree(proc.pid, proc.pid, grace=10)
        assert (report.terminated, report.killed, survivors(proc.pid)) == (1, 0, 0)
        assert proc.wait(10) == -signal.SIGTERM  # not 0: stop_tree did not reap it
    finally:
        proc.kill()
        proc.wait(10)


def test_stop_tree_of_a_finished_tree_does_nothing():
    proc = subprocess.Popen(fake_argv(["exit", 0]), start_new_session=True)
    assert proc.wait(10) == 0
    report = stop_tree(None, proc.pid, grace=1)
    assert (report.terminated, report.killed, survivors(proc.pid)) == (0, 0, 0)


def test_stop_tree_refuses_the_guards_own_group():
    with pytest.raises(ValueError, match="refusing"):
        stop_tree(None, os.getpgrp(), grace=0)
    with pytest.raises(ValueError, match="refusing"):
        terminate_tree(None, 1)


# --- ports -----------------------------------------------------------------------------


def test_a_listening_port_is_busy_and_free_once_closed():
    port = free_port()
    assert port_is_free("127.0.0.1", port)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert not port_is_free("127.0.0.1", port)
        assert not port_is_free("0.0.0.0", port)  # noqa: S104 (a wildcard bind collides too)
        assert not wait_port_free("127.0.0.1", port, timeout=0.2)
    assert port_is_free("127.0.0.1", port)


def test_wait_port_free_returns_when_the_listener_goes():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    closer = threading.Timer(0.2, listener.close)
    closer.start()
    try:
        assert wait_port_free("127.0.0.1", port, timeout=20)
    finally:
        closer.cancel()
        closer.join()
        listener.close()


def test_a_port_in_time_wait_counts_as_free():
    """SO_REUSEADDR, as uvicorn binds: a restart right after a stop must not wait ~60 s.

    (Linux lets the new bind through when the old sockets had SO_REUSEADDR too, as the
    server's did: uvicorn sets it on its listener.)
    """
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        server, _ = listener.accept()
        server.close()  # the server closes first: its side goes to TIME_WAIT
        client.close()
    assert port_is_free("127.0.0.1", port)


def test_an_address_that_is_not_ours_is_an_input_error():
    with pytest.raises(InputError, match=r"cannot bind 192\.0\.2\.1"):
        port_is_free("192.0.2.1", free_port())
