"""Reading the user's files without hanging on them, and writing the guard's own atomically.

`Path.read_text()` on a FIFO with no writer blocks forever, and that would freeze the
supervision loop in the middle of a reload. Files are opened non-blocking, and anything
that is not a regular file is refused before a byte is read. The guard's own files (derived
SGLang YAMLs, the facts cache, the pidfile) are written to a temporary name and renamed, so
a reader never sees half of one.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from sglang_guard.errors import GuardError

_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


class NotARegularFileError(OSError):
    """The path exists but is not a regular file (a directory, a FIFO, a device...)."""


def read_bytes(path: str | Path) -> bytes:
    """The whole file; OSError (NotARegularFileError for the odd kinds) when it cannot be read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise NotARegularFileError(0, f"is {kind}, not a regular file", str(path))
        os.set_blocking(fd, True)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
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


def write_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` via a temporary file and a rename (parents created); OSError."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
