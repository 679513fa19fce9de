"""Reading the user's files without hanging on them, and writing the guard's own atomically.

`Path.read_text()` on a FIFO with no writer blocks forever, and that would freeze the
supervision loop in the middle of a reload. Files are opened non-blocking, and anything
that is not a regular file is refused before a byte is read. The guard's own files (derived
SGLang YAMLs, the facts cache, the pidfile) are written to a temporary name and renamed, so
a reader never sees half of one.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

from sglang_guard.errors import GuardError

_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


class NotARegularFileError(OSError):
    """The path exists but is not a regular file (a directory, a FIFO, a device...)."""


class TooLargeError(OSError):
    """The file is larger than the limit its reader accepts."""


def read_bytes(path: str | Path, *, limit: int | None = None, nofollow: bool = False) -> bytes:
    """The whole file; OSError (NotARegularFileError for the odd kinds) when it cannot be read.

    `limit`: TooLargeError past that many bytes. `nofollow`: a symlink is refused (ELOOP), for
    the guard's own state files, which nobody should be able to redirect.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise NotARegularFileError(0, f"is {kind}, not a regular file", str(path))
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if limit is not None and size > limit:
                raise TooLargeError(0, f"is larger than {limit:,} bytes", str(path))
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str | Path) -> str:
    """The whole file as UTF-8 text (UnicodeDecodeError for binary content)."""
    return read_bytes(path).decode("utf-8")


def read_user_text(path: str, expected: str, error: Callable[[str], GuardError]) -> str:
    """A user's file as text; each way it cannot be read is `error(one line)`, raised."""
    try:
        return read_text(path)
    except FileNotFoundError:
        raise error("file not found") from None
    except NotARegularFileError as exc:
        raise error(f"{exc.strerror}: expected {expected}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read it ({exc})") from None


def write_atomic(path: str | Path, text: str | bytes, mode: int = 0o644, *,
                 fsync: bool = False) -> None:
    """Write `text` (str as UTF-8, or bytes) to `path` via a temporary file and a rename
    (parents created; `fsync`: flushed to disk before the rename); OSError.

    The temporary file has an unguessable name and is created with O_EXCL | O_NOFOLLOW in the
    target's directory, so a planted symlink is never written through; the rename replaces a
    symlink at `path` itself rather than following it. `mode` is exact (umask aside).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.urandom(8).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)  # O_CREAT honours the umask; the caller asked for this mode
            data = text.encode("utf-8") if isinstance(text, str) else text
            while data:
                data = data[os.write(fd, data):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        tmp.replace(target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_private(path: str | Path, text: str, like: str | Path | None = None) -> None:
    """`write_atomic` for files that may hold secrets: 0600 (or `like`'s mode if stricter).

    The parent (the guard's own `derived/` dir) is made 0700. A derived SGLang YAML is a copy
    of the user's, `api-key:` and all.
    """
    target = Path(path)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    target.parent.chmod(0o700)
    mode = 0o600
    if like is not None:
        with contextlib.suppress(OSError):
            mode &= Path(like).stat().st_mode
    write_atomic(target, text, mode)
