"""The child record (`<state-dir>/child.pgid`) and the orphan clean-up that trusts it only so far.

A guard that was SIGKILLed leaves its child's tree behind (GPU memory, the port); the next
guard on the state dir stops it. The record is only a hint: a file left by a power loss names
pids that were reused after the reboot, one left long ago names pids reused since, and anyone
who can write the state dir can plant one. So a process is stopped only when

- the record was written during this boot (`/proc/sys/kernel/random/boot_id`),
- the guard that wrote it is dead (no process with its pid and start time), and
- the process still has the recorded pid, start time and command line, or it is a member of
  the recorded group that carries the recording guard's run token in its environment (a
  process forked after the last snapshot: SGLang's schedulers while the server loads).

Anything else is journaled (`orphans.left`) and left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import psutil

from sglang_guard.common.outcomes import JournalEvent, OrphansLeft, OrphansStopped
from sglang_guard.common.record import record
from sglang_guard.common.shell.files import read_bytes, write_atomic
from sglang_guard.supervise.shell.proctree import group_members, stop_processes

RUN_TOKEN_ENV = "SGLANG_GUARD_RUN"  # noqa: S105 - a variable name, not a secret
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_MAX_RECORD = 1 << 20  # bytes: a record of thousands of processes is far below this
_START_SLACK = 0.01  # seconds: psutil's create_time is derived from clock ticks


def boot_id() -> str | None:
    """This boot's id (None where the kernel does not say)."""
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def new_token() -> str:
    """A fresh run token for one guard's children."""
    return os.urandom(16).hex()


@record
class Entry:
    """One recorded process: pid, start time (epoch s) and command line."""

    pid: int
    start: float
    cmdline: tuple[str, ...]


def describe(proc: psutil.Process) -> Entry | None:
    """The entry for a live process (None when it is gone or cannot be inspected)."""
    try:
        with proc.oneshot():
            return Entry(proc.pid, proc.create_time(), tuple(proc.cmdline()))
    except psutil.Error:
        return None


def record_text(pgid: int, token: str, procs: list[psutil.Process]) -> str:
    """The record's JSON: this guard, this boot, the group and each process of the tree."""
    me = describe(psutil.Process())
    entries = [e for e in map(describe, procs) if e is not None]
    return json.dumps({
        "guard_pid": os.getpid(), "guard_start": me.start if me else None,
        "boot_id": boot_id(), "pgid": pgid, "token": token,
        "procs": [{"pid": e.pid, "start": e.start, "cmdline": list(e.cmdline)} for e in entries],
    })


def write_record(path: Path, pgid: int, token: str, procs: list[psutil.Process]) -> None:
    """Write the record atomically; OSError when the state dir cannot take it."""
    write_atomic(path, record_text(pgid, token, procs), mode=0o600)


def _matches(entry: Entry) -> psutil.Process | None:
    """The live, non-zombie process `entry` names, if pid, start time and cmdline all match."""
    if entry.pid <= 1 or entry.pid == os.getpid():
        return None
    try:
        proc = psutil.Process(entry.pid)
        with proc.oneshot():
            if (abs(proc.create_time() - entry.start) > _START_SLACK
                    or tuple(proc.cmdline()) != entry.cmdline
                    or proc.status() == psutil.STATUS_ZOMBIE):
                return None
    except psutil.Error:
        return None
    return proc


def _carries(proc: psutil.Process, token: str) -> bool:
    try:
        return bool(token) and proc.environ().get(RUN_TOKEN_ENV) == token
    except psutil.Error:
        return False


def _guard_alive(pid: Any, start: Any) -> bool:
    """True when the recording guard still runs (same pid and start time)."""
    if not isinstance(pid, int) or not isinstance(start, (int, float)) or pid == os.getpid():
        return False
    try:
        return abs(psutil.Process(pid).create_time() - float(start)) <= _START_SLACK
    except psutil.Error:
        return False


def _parse(data: bytes) -> dict[str, Any]:
    saved = json.loads(data)
    if not isinstance(saved, dict):
        raise ValueError("not a JSON object")
    entries = []
    for p in saved.get("procs", []):
        entries.append(Entry(int(p["pid"]), float(p["start"]),
                             tuple(str(a) for a in p["cmdline"])))
    saved["entries"] = entries
    return saved


def reap(path: Path, grace: float) -> list[JournalEvent]:
    """Stop what the record at `path` verifiably names; the journal records of what was done."""
    try:
        data = read_bytes(path, limit=_MAX_RECORD, nofollow=True)
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [OrphansLeft(reason=f"record unreadable ({exc.strerror or exc})")]
    try:
        saved = _parse(data)
        pgid = int(saved.get("pgid") or 0)
    except (ValueError, TypeError, KeyError) as exc:
        return [OrphansLeft(reason=f"record malformed ({exc})")]
    guard_pid = saved.get("guard_pid")
    if saved.get("boot_id") is None or saved.get("boot_id") != boot_id():
        return [OrphansLeft(pgid=pgid, guard_pid=guard_pid, reason="recorded in another boot")]
    if _guard_alive(saved.get("guard_pid"), saved.get("guard_start")):
        return [OrphansLeft(pgid=pgid, guard_pid=guard_pid,
                            reason="the recording guard still runs")]
    token = str(saved.get("token") or "")
    verified: dict[int, psutil.Process] = {}
    unverified: list[int] = []
    for entry in saved["entries"]:
        proc = _matches(entry)
        if proc is not None:
            verified[proc.pid] = proc
        elif psutil.pid_exists(entry.pid):
            unverified.append(entry.pid)
    if pgid > 1 and pgid != os.getpgrp():
        for proc in group_members(pgid):
            if proc.pid in verified:
                continue
            if _carries(proc, token):
                verified[proc.pid] = proc
            else:
                unverified.append(proc.pid)
    records: list[JournalEvent] = []
    if verified:
        report = stop_processes(list(verified.values()), grace)
        records.append(OrphansStopped(pgid=pgid, guard_pid=guard_pid, pids=sorted(verified),
                                      terminated=report.terminated, killed=report.killed))
    if unverified:
        records.append(OrphansLeft(
            pgid=pgid, guard_pid=guard_pid, pids=sorted(set(unverified)),
            reason="pid, start time and command line do not match the record"))
    return records


def forget(path: Path) -> None:
    """Remove the record (the guard stopped its tree itself)."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
