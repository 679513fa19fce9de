"""Compiled Hyperscan databases on disk, so that a guard start loads rather than compiles them.

rules/blockscan.py asks for a database by a digest of everything it is compiled from; this
store keeps each as `<cache>/hyperscan/<digest>.hsdb` (`$SGLANG_GUARD_CACHE`, else
~/.cache/sglang-guard). Hyperscan's deserializer is native code and is not meant for bytes
someone else wrote, so nothing is read unless it is the guard's own:
- the directory is created 0700; one that is a symlink, not a directory, not owned by this
  user or writable by group or others is not used at all (every database is compiled);
- a file is opened without following symlinks and read only when it is a regular file owned
  by this user, not writable by group or others, and at most `MAX_BYTES`;
- its content is a magic line, the SHA-256 of the database, the database: a file whose
  digest does not match (truncated, corrupt, or of another format) is ignored and replaced.
Writes go through a temporary file and a rename (0600). Only the newest `KEEP` databases are
kept. Every failure only costs a compile.

A miss is built by a short-lived `python -m sglang_guard.rules.shell.scancache DIR` (the patterns
and whether the set is per-line, as JSON on stdin), not in the guard: compiling leaves
~5 MiB in a process for good, and the guard is the process that lives for months
(`build_elsewhere`).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

from sglang_guard.common.sha import sha256

MAGIC = b"sglang-guard hsdb 1\n"
MAX_BYTES = 64 << 20
KEEP = 32
_SUFFIX = ".hsdb"


def cache_root() -> Path:
    """`$SGLANG_GUARD_CACHE`, else ~/.cache/sglang-guard (as the model-facts cache)."""
    return Path(os.environ.get("SGLANG_GUARD_CACHE") or Path.home() / ".cache" / "sglang-guard")


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


class FileStore:
    """A `rules.blockscan.DatabaseStore` in one private directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.usable: bool | None = None  # checked on first use
        self.why: str | None = None  # why it is not usable

    def ready(self) -> bool:
        """Whether the directory is usable (checked once)."""
        if self.usable is None:
            self.usable = self._check()
        return self.usable

    def _check(self) -> bool:
        try:
            self.directory.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with contextlib.suppress(FileExistsError):
                self.directory.mkdir(mode=0o700)
            st = os.lstat(self.directory)
        except OSError as exc:
            self.why = f"cannot create {self.directory}: {exc}"
            return False
        if not stat.S_ISDIR(st.st_mode):
            self.why = f"{self.directory} is not a directory"
        elif not _private(st):
            self.why = f"{self.directory} is not owned by this user or is writable by others"
        return self.why is None

    def _path(self, key: str) -> Path | None:
        if not key or not all(c in "0123456789abcdef" for c in key):
            return None
        return self.directory / f"{key}{_SUFFIX}"

    def load(self, key: str) -> bytes | None:
        """The database saved under `key`, or None (missing, not ours, or corrupt)."""
        path = self._path(key)
        if path is None or not self.ready():
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not _private(st) or st.st_size > MAX_BYTES:
                return None
            data = f.read(MAX_BYTES + 1)
        head = len(MAGIC) + 32
        if len(data) <= head or not data.startswith(MAGIC):
            return None
        digest, blob = data[len(MAGIC):head], data[head:]
        if sha256(blob).digest() != digest:
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: kept by the pruning below
        return blob

    def save(self, key: str, blob: bytes) -> None:
        """Write the database under `key` (atomically, 0600); quietly nothing on failure."""
        path = self._path(key)
        if path is None or not self.ready() or len(blob) > MAX_BYTES:
            return
        tmp = path.with_name(f".{path.name}.{os.urandom(8).hex()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + sha256(blob).digest() + blob)
            tmp.replace(path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        self._prune()

    def _prune(self) -> None:
        with contextlib.suppress(OSError):
            found = sorted(((p.stat().st_mtime, p) for p in self.directory.glob(f"*{_SUFFIX}")),
                           reverse=True)
            for _, old in found[KEEP:]:
                with contextlib.suppress(OSError):
                    old.unlink()


def default_store() -> FileStore:
    """The store `sglang-guard run` uses."""
    return FileStore(cache_root() / "hyperscan")


BUILD_TIMEOUT_S = 300.0


def build_elsewhere(store: FileStore) -> Callable[[tuple[str, ...], bool], None]:
    """A `rules.blockscan` builder: compile `patterns` into `store` in a child process."""
    def build(patterns: tuple[str, ...], lines: bool) -> None:
        import subprocess  # noqa: PLC0415 - only on a miss
        import sys  # noqa: PLC0415

        if not store.ready():
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([sys.executable, "-m", "sglang_guard.rules.shell.scancache",
                            str(store.directory)],
                           input=json.dumps({"patterns": list(patterns), "lines": lines}).encode(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=BUILD_TIMEOUT_S, check=False)

    return build


def _main(argv: list[str]) -> int:
    """`python -m sglang_guard.rules.shell.scancache DIR`: compile the patterns on stdin into
    DIR."""
    import sys  # noqa: PLC0415

    from sglang_guard.rules import blockscan  # noqa: PLC0415

    asked = json.loads(sys.stdin.buffer.read())
    patterns = asked.get("patterns") if isinstance(asked, dict) else None
    lines = asked.get("lines", False) if isinstance(asked, dict) else None
    if (not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns)
            or not isinstance(lines, bool)):
        return 2
    blockscan.use_store(FileStore(Path(argv[0])))  # no builder here: this is the builder
    blockscan.BlockScan(patterns, lines=lines).compile()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
