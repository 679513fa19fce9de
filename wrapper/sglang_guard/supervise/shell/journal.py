"""The remediation journal: `<state-dir>/journal.jsonl`, one JSON object per line, fsync'd.

A crash can leave a truncated last line; `read_journal` skips lines that do not parse, so
readers never break on it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sglang_guard.common.outcomes import JournalEvent
from sglang_guard.errors import ConfigError
from sglang_guard.sglang.redact import redact_record


class Journal:
    """An append-only JSONL file; `write` returns False (never raises) once the disk fails."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self.error: str | None = None

    @classmethod
    def open(cls, state_dir: str) -> Journal:
        """Open (creating the state dir); ConfigError when it cannot be written."""
        journal = cls(Path(state_dir) / "journal.jsonl")
        try:
            journal.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # O_NOFOLLOW: a journal.jsonl planted as a symlink must not get JSON appended to
            # whatever it points at. O_RDWR: the torn-line check reads the same file.
            journal._fd = os.open(journal.path, os.O_RDWR | os.O_APPEND | os.O_CREAT
                                  | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            if _torn(journal._fd):  # end the torn line, or our first event would be glued to it
                os.write(journal._fd, b"\n")
        except OSError as exc:
            raise ConfigError(state_dir, None,
                              f"state dir is not writable ({exc.strerror})") from None
        return journal

    def write(self, event: JournalEvent) -> bool:
        """Append one event (its record, with `ts`); False when it could not be stored."""
        if self._fd is None:
            return False
        now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        line = json.dumps({"ts": now, **redact_record(event.to_record())}, default=str) + "\n"
        try:
            os.write(self._fd, line.encode())
            os.fsync(self._fd)
        except OSError as exc:
            self.error = exc.strerror or str(exc)
            return False
        return True

    def close(self) -> None:
        """Close the file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _torn(fd: int) -> bool:
    """True when the file's last line has no newline (a crash cut it short)."""
    try:
        size = os.fstat(fd).st_size
    except OSError:
        return False
    if size == 0:
        return False
    try:
        return os.pread(fd, 1, size - 1) != b"\n"
    except OSError:  # a device (/dev/full) cannot be read back: nothing to mend
        return False


def read_journal(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete event in the journal (a torn last line is skipped)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    for raw in data.splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record
