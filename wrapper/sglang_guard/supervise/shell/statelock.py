"""One guard per state dir: the dir made safe, and an advisory lock held for the guard's life.

Two guards on one state dir would each take the other's `child.pgid` for its own orphans and
append to one journal. The lock (`flock` on `<state-dir>/guard.lock`) is released by the
kernel when the guard exits, however it exits, so a SIGKILLed guard never blocks the next
one; the lock file's content (the holder's pid) is only for the error message.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from sglang_guard.errors import InputError

LOCK_NAME = "guard.lock"
DEFAULT_PORT = 30000  # SGLang's own default for --port


class StateDirUnavailable(InputError):
    """The state dir cannot be created or written (the guard then runs without one)."""


def private_name() -> str:
    """The guard's own subdirectory in a state dir that others may write (a 0777 emptyDir)."""
    return f"sglang-guard-{os.geteuid()}"


def ensure_state_dir(state_dir: str) -> Path:
    """The dir the guard keeps its files in: `state_dir` (created 0700, parents as needed), or
    its 0700 subdirectory `sglang-guard-<uid>` when others may write `state_dir` itself.

    The kubelet creates every emptyDir 0777 (root-owned), so a pod's state dir mount is
    writable by every user; anyone who can write the dir the guard's files live in could
    plant a `child.pgid` or swap the journal for a symlink. So the files go one level down,
    in a dir only the guard's user may write; what is refused is what stays unsafe there: a
    subdirectory that is a symlink or another user's (InputError).
    """
    path = Path(state_dir)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()  # a symlinked state dir is the operator's choice: its target counts
    except OSError as exc:
        raise StateDirUnavailable(f"state dir {state_dir}: cannot create it "
                                  f"({exc.strerror or exc})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"state dir {state_dir}: not a directory")
    if not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return path
    return _private(path / private_name())


def _private(sub: Path) -> Path:
    """`sub` made (0700) or checked: a real directory of this user that only it can write."""
    try:
        sub.mkdir(mode=0o700, exist_ok=True)
        st = sub.lstat()
    except OSError as exc:
        raise StateDirUnavailable(f"state dir {sub}: cannot create it "
                                  f"({exc.strerror or exc})") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise InputError(f"state dir {sub}: not a directory of its own (a symlink?): in a "
                         "directory that other users may write, the guard uses only a real "
                         "directory it owns")
    if st.st_uid != os.geteuid():
        raise InputError(f"state dir {sub}: owned by uid {st.st_uid}, not this guard's "
                         f"uid {os.geteuid()}")
    if stat.S_IMODE(st.st_mode) & 0o077:
        sub.chmod(0o700)  # lstat said: a real directory, not a symlink
    return sub


def _holder(lock: Path) -> str:
    with contextlib.suppress(OSError, ValueError):
        pid = int(lock.read_text().strip() or "0")
        if pid > 0:
            return f"pid {pid}"
    return "pid unknown"


@contextlib.contextmanager
def hold_state_dir(state_dir: str) -> Iterator[Path]:
    """Hold `<state_dir>/guard.lock` while the block runs; InputError when another guard has it.

    StateDirUnavailable when the dir cannot be made or the lock file opened: no other guard
    can be using a dir nobody can write, so the caller may run without one.
    """
    path = ensure_state_dir(state_dir)
    lock = path / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StateDirUnavailable(f"state dir {state_dir}: cannot open {LOCK_NAME} "
                                  f"({exc.strerror or exc})") from None
    import fcntl  # noqa: PLC0415 - its load is ~1 ms of a `check`, which locks nothing

    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise InputError(f"state dir {state_dir}: cannot lock {LOCK_NAME} "
                                 f"({exc.strerror or exc})") from None
            raise InputError(f"state dir {state_dir} is in use by another guard "
                             f"({_holder(lock)}); give each guard its own --state-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock


def default_run_state_dir(argv: Sequence[str]) -> str:
    """`$SGLANG_GUARD_STATE_DIR` as given, else the per-user (or root) default per instance."""
    from sglang_guard.preflight.shell.inputs import default_state_dir  # noqa: PLC0415

    if os.environ.get("SGLANG_GUARD_STATE_DIR"):
        return os.environ["SGLANG_GUARD_STATE_DIR"]
    return instance_state_dir(default_state_dir(), argv)


def instance_state_dir(base: str, argv: Sequence[str]) -> str:
    """`base/port-<port>`: the default state dir of the guard serving SGLang on that port.

    Two guards on one host never share a default dir by accident; the port is read the way
    SGLang reads it (last `--port`, abbreviations, `--config` YAML), and a port SGLang's
    parser would reject is an InputError here, before anything is launched.
    """
    from sglang_guard.preflight.shell.inputs import read_command_line  # noqa: PLC0415

    raw = read_command_line(argv).value("port")
    return str(Path(base) / f"port-{parse_port(raw)}")


def parse_port(raw: str | None) -> int:
    """The --port value as SGLang's `type=int` reads it; InputError otherwise."""
    if raw is None:
        return DEFAULT_PORT
    try:
        port = int(raw.strip())
    except ValueError:
        raise InputError(f"--port {raw}: not a port number") from None
    if not 0 < port < 65536:
        raise InputError(f"--port {raw}: not a port number (1-65535)")
    return port
