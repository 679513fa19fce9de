"""Orphan clean-up trusts the child record only as far as it can verify it
(supervise/shell/orphans.py).

Each test plants a record naming a real process (a `sleep` in its own session, as a stranger
started with setsid would be) and checks that it is stopped only when pid, start time and
command line match, the record is from this boot, and the recording guard is dead.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from sglang_guard.supervise.shell import orphans
from support.procs import wait_gone


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A process in its own session that no guard started."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def dead_pid() -> tuple[int, float]:
    """The pid and start time of a process that has exited (a SIGKILLed guard)."""
    proc = subprocess.Popen(["true"])
    started = psutil.Process(proc.pid).create_time()
    proc.wait()
    return proc.pid, started


def plant(path: Path, proc: subprocess.Popen[bytes], **over: Any) -> None:
    """A record in the current format naming `proc`, written by a dead guard this boot."""
    ps = psutil.Process(proc.pid)
    guard_pid, guard_start = dead_pid()
    record: dict[str, Any] = {
        "guard_pid": guard_pid, "guard_start": guard_start, "boot_id": orphans.boot_id(),
        "pgid": proc.pid, "token": "t" * 32,
        "procs": [{"pid": proc.pid, "start": ps.create_time(), "cmdline": ps.cmdline()}]}
    record.update(over)
    path.write_text(json.dumps(record))


def alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def test_a_record_that_matches_and_whose_guard_is_dead_is_stopped(
        tmp_path: Path, stranger: subprocess.Popen[bytes]) -> None:
    path = tmp_path / "child.pgid"
    plant(path, stranger)
    records = [r.to_record() for r in orphans.reap(path, grace=2.0)]
    assert [r["event"] for r in records] == ["orphans.stopped"]
    assert records[0]["pids"] == [stranger.pid]
    stranger.wait(10)


def test_an_old_format_record_naming_a_stranger_is_left_alone(
        tmp_path: Path, stranger: subprocess.Popen[bytes]) -> None:
    # the record main wrote: pgid + (pid, start time); enough to kill a stranger before
    path = tmp_path / "child.pgid"
    started = psutil.Process(stranger.pid).create_time()
    path.write_text(json.dumps({"pgid": stranger.pid, "procs": [[stranger.pid, started]]}))
    records = [r.to_record() for r in orphans.reap(path, grace=0.2)]
    assert [r["event"] for r in records] == ["orphans.left"]
    assert wait_gone([stranger.pid], timeout=0.5) == [stranger.pid]


@pytest.mark.parametrize("change", ["cmdline", "start", "boot_id", "guard_alive"])
def test_a_record_that_does_not_verify_is_journaled_and_left_alone(
        tmp_path: Path, stranger: subprocess.Popen[bytes], change: str) -> None:
    path = tmp_path / "child.pgid"
    ps = psutil.Process(stranger.pid)
    entry = {"pid": stranger.pid, "start": ps.create_time(), "cmdline": ps.cmdline()}
    over: dict[str, Any] = {}
    if change == "cmdline":
        over["procs"] = [{**entry, "cmdline": ["python", "-m", "sglang.launch_server"]}]
    elif change == "start":
        over["procs"] = [{**entry, "start": entry["start"] - 3600}]
    elif change == "boot_id":
        over["boot_id"] = "00000000-0000-0000-0000-000000000000"
    else:  # the recording guard still runs (here: this test's own parent, with its start)
        parent = psutil.Process(os.getppid())
        over |= {"guard_pid": parent.pid, "guard_start": parent.create_time()}
    plant(path, stranger, **over)
    records = [r.to_record() for r in orphans.reap(path, grace=0.2)]
    assert records and all(r["event"] == "orphans.left" for r in records), records
    assert alive(stranger)


def test_an_unrecorded_group_member_is_stopped_only_with_the_run_token(tmp_path: Path) -> None:
    token = orphans.new_token()
    env = {**os.environ, orphans.RUN_TOKEN_ENV: token}
    ours = subprocess.Popen(["sleep", "300"], start_new_session=True, env=env)
    theirs = subprocess.Popen(["sleep", "301"], start_new_session=True)
    try:
        for proc, expect in ((ours, "orphans.stopped"), (theirs, "orphans.left")):
            path = tmp_path / f"{proc.pid}.pgid"
            plant(path, proc, token=token, procs=[])  # forked after the last snapshot
            assert [r.event for r in orphans.reap(path, grace=2.0)] == [expect]
        ours.wait(10)
        assert alive(theirs)
    finally:
        for proc in (ours, theirs):
            proc.kill()
            proc.wait()


def test_a_symlinked_or_huge_record_is_not_trusted(
        tmp_path: Path, stranger: subprocess.Popen[bytes]) -> None:
    real = tmp_path / "elsewhere.json"
    plant(real, stranger)
    link = tmp_path / "child.pgid"
    link.symlink_to(real)
    assert [r.event for r in orphans.reap(link, grace=0.2)] == ["orphans.left"]
    big = tmp_path / "big.pgid"
    big.write_bytes(b" " * (2 << 20))
    assert [r.event for r in orphans.reap(big, grace=0.2)] == ["orphans.left"]
    assert alive(stranger)
