"""Stop a child's whole process tree: snapshot, SIGTERM, wait, SIGKILL what survives.

SGLang runs as a tree (the launcher, `sglang::scheduler`, `sglang::detokenizer`, a
multiprocessing resource tracker), so killing only the main pid leaks GPU memory and ports.

Exits are awaited through pidfds (`pidfd_open`, Linux 5.3+), not `psutil.wait_procs`:
`wait_procs` calls `waitpid` on our own child and so reaps it, stealing the exit status
from the `Popen` that owns it (its `wait` then reports 0). A pidfd becomes readable when the
process exits, zombie or not, and reaps nothing. Without pidfds we poll, every 20 ms.

A stop comes in two halves: `terminate_tree` (find the tree, then SIGTERM: the supervision
loop calls it at once, before it journals the decision) and `finish_stop` (the grace, SIGKILL,
the wait: a stopper thread's). The tree is found in two reads:
- before the SIGTERM, the main process's descendants by their parents' children lists
  (/proc/<pid>/task/<tid>/children): its cost is the tree's, not the machine's (the bench's
  one-process child: ~0.05 ms against ~1.4 ms for the whole table here, which grows with
  every process and kernel thread of the host). A descendant that called setsid is found
  here while its parent still lives: the SIGTERM may end that parent, and an orphan is
  reparented out of every tree;
- after it, the whole table: each process's /proc/<pid>/stat once (parent, group, session),
  not psutil's walk of the machine (one process object and three lookups per process, and a
  second walk for the descendants: ~18 against ~4 us a process here), for the group's and
  session's members the walk did not reach (a member whose parent already died): by
  `finish_stop`, on the stopper's thread, before its grace.
Without children lists (a kernel without CONFIG_PROC_CHILDREN) or without a live main process,
the table comes first, as the only read.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

from sglang_guard.common.record import record

KILL_WAIT = 10.0  # seconds to let SIGKILLed processes go (a process in a driver call dies late)
_POLL = 0.02  # fallback poll interval when pidfds are unavailable
# After a walk's SIGTERM, how long `finish_stop` lets the walked processes end before it reads
# the whole table (part of the grace): a reparented member's SIGTERM comes that much later.
TABLE_AFTER_S = 0.02


@record
class StopReport:
    """What `stop_tree` did: exits on SIGTERM, processes SIGKILLed, processes still alive."""

    terminated: int
    killed: int
    seconds: float


class _Handle:
    """One process of the snapshot, held by pidfd so that a reused pid is never signalled
    (without pidfds, by its psutil object, which checks the start time: `proc`)."""

    __slots__ = ("fd", "pid", "proc")

    def __init__(self, pid: int, fd: int | None, proc: psutil.Process | None = None) -> None:
        if fd is None and proc is None:
            raise ValueError("a process is held by a pidfd or a psutil object")
        self.pid = pid
        self.fd = fd
        self.proc = proc

    def exited(self) -> bool:
        """True once the process has exited (a zombie counts: it holds nothing but its pid)."""
        if self.fd is not None:
            return bool(_poll([self.fd], 0))
        assert self.proc is not None  # noqa: S101 - __init__ holds one of the two
        try:
            return self.proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    def send(self, sig: signal.Signals) -> None:
        """Send `sig`; a process that is already gone counts as done (ESRCH)."""
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            elif self.proc is not None:
                self.proc.send_signal(sig)  # psutil checks the create time: no reused pid

    def close(self) -> None:
        """Release the pidfd."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _poll(fds: list[int], timeout: float) -> list[tuple[int, int]]:
    # poll, not select: no FD_SETSIZE limit on the pidfd numbers of a long-lived guard
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return poller.poll(timeout * 1000)


def _in_group(pid: int, pgid: int) -> bool:
    try:
        return os.getpgid(pid) == pgid or os.getsid(pid) == pgid
    except OSError:  # gone, or not ours to inspect
        return False


def _group(pgid: int) -> list[psutil.Process]:
    """Live members of the process group or session `pgid`, never the guard itself."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid() or not _in_group(proc.pid, pgid):
            continue
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def _stat_table() -> dict[int, tuple[bool, int, int, int]] | None:
    """Every process: (zombie, parent, group, session) from /proc/<pid>/stat; None: no /proc."""
    try:
        names = os.listdir("/proc")  # noqa: PTH208 - names only: no Path object per process
    except OSError:
        return None
    table: dict[int, tuple[bool, int, int, int]] = {}
    for name in names:
        if not name.isdigit():
            continue
        fields = _stat_fields(name, 4)
        if fields is None or len(fields) < 4:  # gone meanwhile
            continue
        table[int(name)] = (fields[0] == b"Z", int(fields[1]), int(fields[2]), int(fields[3]))
    return table


def _stat_fields(pid: int | str, split: int) -> list[bytes] | None:
    """/proc/<pid>/stat's fields after the command's name (state, parent, group, session,
    ...), the first `split` apart; None: gone, or no /proc."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 1024)
    except OSError:
        return None
    finally:
        os.close(fd)
    # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses
    return data[data.rfind(b")") + 2:].split(None, split)


def _read_all(fd: int) -> bytes:
    parts = [os.read(fd, 4096)]
    while parts[-1]:
        parts.append(os.read(fd, 4096))
    return b"".join(parts)


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/<pid>/stat's 22nd field,
    psutil's create time); None: gone, or no /proc."""
    fields = _stat_fields(pid, 20)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def _now_ticks() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME) * _CLK_TCK


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children(pid: int) -> list[int] | None:
    """The children of `pid`, from each of its threads' children list (a child is listed
    under the thread that forked it); [] when `pid` is gone; None: no such lists here."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")  # noqa: PTH208 - names only
    except FileNotFoundError:
        return []
    except OSError:
        return None
    kids: list[int] = []
    for tid in tids:
        try:  # os.open/os.read: no file object (~40 us a list less, cold, on the stop's path)
            fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY | os.O_CLOEXEC)
            try:
                kids += [int(kid) for kid in _read_all(fd).split()]
            finally:
                os.close(fd)
        except FileNotFoundError:
            if tid == str(pid) and os.path.exists(f"/proc/{pid}/task/{tid}"):  # noqa: PTH110
                return None  # the main thread lives but has no list: the kernel keeps none
        except OSError:
            continue  # a thread that ended meanwhile
    return kids


def _walk(pid: int) -> list[int] | None:
    """`pid` and every descendant's pid, by the children lists (None: none here; see the
    module's docstring), parents before their children."""
    found: dict[int, None] = {}
    todo = [pid]
    me = os.getpid()
    while todo:
        p = todo.pop()
        if p in found or p == me:
            continue
        kids = _children(p)
        if kids is None:
            return None
        found[p] = None
        todo += kids
    return list(found)


def _descendants(pid: int) -> list[psutil.Process] | None:
    """`pid` and every descendant, by the children lists (None: none here; see the module's
    docstring); a process that ended meanwhile is left out."""
    walked = _walk(pid)
    return None if walked is None else _as_processes(walked)


def tree(pid: int) -> list[psutil.Process]:
    """`pid` and every descendant, `pid` first: the walk the stop makes before its SIGTERM
    (by the children lists; psutil's walk where there are none). The supervisor's record of
    the tree takes it, so the stop's first walk is not its first (~0.4 ms more cold: the
    lists' reads, psutil's first process object). psutil.NoSuchProcess: `pid` is gone."""
    walked = _descendants(pid)
    if walked is None:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    if not walked or walked[0].pid != pid:
        raise psutil.NoSuchProcess(pid)
    return walked


def _snapshot(pid: int | None, pgid: int) -> dict[int, psutil.Process]:
    """The main process, its descendants, the group, the session, and their descendants."""
    table = _stat_table()
    if table is None:
        return _snapshot_psutil(pid, pgid)
    me = os.getpid()
    roots = [p for p, (zombie, _, group, session) in table.items()
             if not zombie and p != me and pgid in (group, session)]
    if pid is not None and pid in table:
        roots.append(pid)
    kids: dict[int, list[int]] = {}
    for p, (_, parent, _, _) in table.items():
        kids.setdefault(parent, []).append(p)
    # Descendants that called setsid left the group but are still children of a member;
    # once their parent dies they are reparented and only this snapshot remembers them.
    found: list[int] = []
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        found.append(p)
        todo.extend(kids.get(p, ()))
    procs: dict[int, psutil.Process] = {}
    for p in found:
        if p == me:
            continue
        with contextlib.suppress(psutil.NoSuchProcess):
            procs[p] = psutil.Process(p)
    return procs


def _snapshot_psutil(pid: int | None, pgid: int) -> dict[int, psutil.Process]:
    """`_snapshot` where there is no /proc to read: psutil's walk."""
    roots = _group(pgid)
    if pid is not None:
        with contextlib.suppress(psutil.NoSuchProcess):
            roots.append(psutil.Process(pid))
    procs: dict[int, psutil.Process] = {}
    for root in roots:
        procs[root.pid] = root
        # Descendants that called setsid left the group but are still children of a member;
        # once their parent dies they are reparented and only this snapshot remembers them.
        with contextlib.suppress(psutil.NoSuchProcess):
            for kid in root.children(recursive=True):
                procs.setdefault(kid.pid, kid)
    procs.pop(os.getpid(), None)
    return procs


def _open(procs: Iterable[psutil.Process]) -> list[_Handle]:
    handles = []
    for proc in procs:
        fd: int | None = None
        try:
            fd = os.pidfd_open(proc.pid)
        except ProcessLookupError:
            continue
        except (OSError, AttributeError):  # no pidfds here (old kernel, not Linux): poll instead
            fd = None
        handle = _Handle(proc.pid, fd, proc)
        # The pid may have been reused between the snapshot and pidfd_open.
        if not proc.is_running() or handle.exited():
            handle.close()
            continue
        handles.append(handle)
    return handles


def _wait(handles: list[_Handle], timeout: float) -> list[_Handle]:
    """Wait up to `timeout` for every handle to exit; returns those still alive."""
    deadline = time.monotonic() + timeout
    alive = [h for h in handles if not h.exited()]
    while alive:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        fds = [h.fd for h in alive if h.fd is not None]
        if len(fds) == len(alive):
            _poll(fds, left)
        else:
            time.sleep(min(left, _POLL))
        alive = [h for h in alive if not h.exited()]
    return alive


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


@dataclass(slots=True)
class Stopping:
    """A tree `terminate_tree` sent SIGTERM to; `finish_stop` waits for it and SIGKILLs."""

    pgid: int
    handles: list[_Handle]
    started: float
    pid: int | None = None  # the main process, as `terminate_tree` was given it
    table_due: bool = False  # the whole table is still to read (after a walk: `_read_table`)
    early: bool = False  # a pipe's reader sent the SIGTERM (supervise/shell/child.py)


def terminate_tree(pid: int | None, pgid: int) -> Stopping:
    """Find the tree of `pid` and the group/session `pgid`, then SIGTERM all of it.

    `pid` is None when the main process was already reaped (its number may be reused). The
    tree is found first (the walk, or without one the whole table): a member that left the
    group (setsid) is found through its parent, which the SIGTERM may end. Pass the result
    to `finish_stop`, which reads the table after a walk and closes the pidfds.
    """
    if pgid <= 1 or pgid == os.getpgrp():
        raise ValueError(f"refusing to signal process group {pgid}")  # a bug in the caller
    started = time.monotonic()
    handles: list[_Handle] = []
    try:
        # In C, the walk and its pidfds in one call (`_held_tree`); where it cannot (None),
        # the same in Python, which also knows the ways without children lists or pidfds.
        pairs = _held_tree(pid) if pid is not None and _held_tree is not None else None
        if pairs is not None:
            handles += [_Handle(p, fd) for p, fd in pairs]
            walked: list[int] | None = [p for p, _ in pairs]
        else:
            since = _now_ticks()
            walked = _walk(pid) if pid is not None else None
            held = _open_walked(walked, since) if walked is not None else None
            if held is not None:
                handles += held
            else:
                handles += _open(_snapshot(pid, pgid).values() if walked is None
                                 else _as_processes(walked))
        _killpg(pgid, signal.SIGTERM)
        for handle in handles:  # members outside the group (setsid) get their chance too
            handle.send(signal.SIGTERM)
    except BaseException:
        for handle in handles:
            handle.close()
        raise
    return Stopping(pgid, handles, started, pid, table_due=walked is not None)


def _load_held_tree() -> Callable[[int], list[tuple[int, int]] | None] | None:
    """`_walk` and `_open_walked` in one C call (`_proctree.c`, built by the wheel's build
    hook, hatch_build.py): `held_tree(pid)` -> [(pid, pidfd)], or None where the kernel
    keeps no children lists or has no pidfds (the Python path then says which). In Python
    the same reads took ~0.27 ms cold for a one-process tree and ~1.1 ms for a process of
    60 threads, in C ~0.17 and ~0.84 (this VM: the /proc reads themselves are most of it),
    before the SIGTERM. None without the module (no C compiler at install, not Linux,
    SGLANG_GUARD_PURE=1): the Python walk, the same tree."""
    if os.environ.get("SGLANG_GUARD_PURE") == "1":
        return None
    try:
        from sglang_guard.supervise.shell import _proctree  # noqa: PLC0415
    except ImportError:
        return None
    held: Callable[[int], list[tuple[int, int]] | None] = _proctree.held_tree
    return held


_held_tree = _load_held_tree()


def _as_processes(pids: Iterable[int]) -> list[psutil.Process]:
    found = []
    for p in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            found.append(psutil.Process(p))
    return found


def _open_walked(pids: list[int], since: float) -> list[_Handle] | None:
    """Pidfds for the walked `pids`, with no psutil object (~0.2 ms less, cold, before the
    SIGTERM): a pid whose process started after the walk began (`since`, in ticks: a
    number reused meanwhile) or that already exited is left out. None: no pidfds here."""
    handles: list[_Handle] = []
    for p in pids:
        try:
            fd = os.pidfd_open(p)
        except ProcessLookupError:
            continue
        except (OSError, AttributeError):  # no pidfds here: psutil's objects instead
            for handle in handles:
                handle.close()
            return None
        handle = _Handle(p, fd)
        begun = _start_ticks(p)
        # A tick of slack: the walk's clock and the process's start are rounded apart.
        if begun is None or begun > since + 1 or handle.exited():
            handle.close()
            continue
        handles.append(handle)
    return handles


def _read_table(stopping: Stopping) -> None:
    """After a walk's SIGTERM: the members of the group and session that the walk could
    not reach, from the whole table, SIGTERMed as found. `finish_stop` does it on the
    stopper's thread, once the walked processes ended or TABLE_AFTER_S passed: not on the
    loop's, and not while the child's end needs a CPU (measured on 2 cores: the table's
    ~1 ms read beside the dying child cost the idle reaction ~0.5-0.8 ms)."""
    if not stopping.table_due:
        return
    stopping.table_due = False
    for handle in _hold_new(stopping.handles, _snapshot(stopping.pid, stopping.pgid).values()):
        handle.send(signal.SIGTERM)


def _hold_new(handles: list[_Handle], procs: Iterable[psutil.Process]) -> list[_Handle]:
    """Pidfds for those of `procs` that `handles` does not hold yet, added to it: the new."""
    known = {handle.pid for handle in handles}
    late = _open(proc for proc in procs if proc.pid not in known)
    handles += late
    return late


def finish_stop(stopping: Stopping, grace: float) -> StopReport:
    """After `terminate_tree`: wait up to `grace`, SIGKILL what survives (and what the group
    forked since), wait up to KILL_WAIT for it to go."""
    pgid, handles = stopping.pgid, stopping.handles
    try:
        if stopping.table_due:  # the walked tree's own end first (its CPU)
            waited = time.monotonic()
            _wait(handles, min(grace, TABLE_AFTER_S))
            grace = max(0.0, grace - (time.monotonic() - waited))
        _read_table(stopping)
        survivors = _wait(handles, grace)
        terminated = len(handles) - len(survivors)
        # Processes forked after the snapshot are in the group; killpg reaches them.
        _killpg(pgid, signal.SIGKILL)
        late = _hold_new(handles, _group(pgid))
        for handle in survivors + late:
            handle.send(signal.SIGKILL)
        _wait(survivors + late, KILL_WAIT)
        return StopReport(
            terminated=terminated,
            killed=len(survivors) + len(late),
            seconds=time.monotonic() - stopping.started,
        )
    finally:
        for handle in handles:
            handle.close()


def stop_tree(pid: int | None, pgid: int, grace: float) -> StopReport:
    """SIGTERM the tree of `pid` and the group/session `pgid`, SIGKILL what outlives `grace`.

    `pid` is None when the main process was already reaped (its number may be reused).
    Blocks until nothing of the tree remains or KILL_WAIT passed after the SIGKILL.
    """
    return finish_stop(terminate_tree(pid, pgid), grace)


def find_orphans(pgid: int) -> list[int]:
    """Pids still in the process group or session `pgid` (a previous guard's leftovers)."""
    return sorted(proc.pid for proc in _group(pgid))


def group_members(pgid: int) -> list[psutil.Process]:
    """Live members of the process group or session `pgid`, never the guard itself."""
    return _group(pgid)


def stop_processes(procs: Iterable[psutil.Process], grace: float) -> StopReport:
    """SIGTERM exactly these processes (held by pidfd), SIGKILL what outlives `grace`.

    Nothing else is signalled: no group, no descendants (orphan clean-up verified each one).
    """
    started = time.monotonic()
    handles = _open(p for p in procs if p.pid != os.getpid())
    try:
        for handle in handles:
            handle.send(signal.SIGTERM)
        survivors = _wait(handles, grace)
        for handle in survivors:
            handle.send(signal.SIGKILL)
        _wait(survivors, KILL_WAIT)
        return StopReport(terminated=len(handles) - len(survivors), killed=len(survivors),
                          seconds=time.monotonic() - started)
    finally:
        for handle in handles:
            handle.close()
