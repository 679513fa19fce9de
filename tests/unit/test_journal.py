"""The remediation journal: one fsync'd JSON object per event, readers that survive a torn line."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest

from sglang_guard.common.outcomes import ChildStarted, ReloadApplied, Stable
from sglang_guard.errors import ConfigError
from sglang_guard.supervise.shell.journal import Journal, read_journal


def test_each_event_is_one_line_with_ts_and_event(tmp_path: Path) -> None:
    journal = Journal.open(str(tmp_path / "a" / "b"))  # the state dir is created
    assert journal.write(ChildStarted(gen=1, reason="start", argv=["--port", "1"]))
    assert journal.write(ReloadApplied(kind="rule_pack", path=Path("/x"),  # type: ignore[arg-type]
                                       restart=False, why="x"))  # non-JSON values as text
    journal.close()
    lines = (tmp_path / "a" / "b" / "journal.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["event"] == "child.start"
    assert first["argv"] == ["--port", "1"]
    assert dt.datetime.fromisoformat(first["ts"]).utcoffset() == dt.timedelta(0)
    assert second["path"] == "/x"
    assert second["event"] == "reload.applied"


def test_reopening_appends(tmp_path: Path) -> None:
    for n in range(3):
        journal = Journal.open(str(tmp_path))
        journal.write(Stable(gen=n))
        journal.close()
    assert [r["gen"] for r in read_journal(tmp_path / "journal.jsonl")] == [0, 1, 2]


def test_every_event_is_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = Journal.open(str(tmp_path))
    synced: list[int] = []
    real = os.fsync
    def fsync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    for n in range(3):
        journal.write(Stable(gen=n))
    journal.close()
    assert len(synced) == 3


def test_a_torn_last_line_and_junk_do_not_break_readers(tmp_path: Path) -> None:
    journal = Journal.open(str(tmp_path))
    journal.write(Stable(gen=1))
    journal.write(Stable(gen=2))
    journal.close()
    path = tmp_path / "journal.jsonl"
    with path.open("ab") as fh:
        fh.write(b'[1, 2]\nnot json\n\xff\xfe\n{"ts": "2026-01-01", "event": "thr')
    assert [r["gen"] for r in read_journal(path)] == [1, 2]
    # The next guard ends the torn line first: its own first event is not glued to it.
    journal = Journal.open(str(tmp_path))
    journal.write(Stable(gen=4))
    journal.close()
    assert [r["gen"] for r in read_journal(path)] == [1, 2, 4]
    assert path.read_bytes().endswith(b'"event": "stable", "gen": 4}\n')


def test_a_missing_journal_reads_as_empty(tmp_path: Path) -> None:
    assert list(read_journal(tmp_path / "none.jsonl")) == []


def test_unwritable_state_dir_is_a_config_error_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="state dir is not writable") as info:
        Journal.open(str(blocker / "state"))
    assert info.value.path == str(blocker / "state")


def test_a_failing_disk_makes_write_return_false_not_raise() -> None:
    journal = Journal(Path("/dev/full"))
    journal._fd = os.open("/dev/full", os.O_WRONLY)
    assert journal.write(Stable(gen=1)) is False
    assert journal.error
    journal.close()
    assert journal.write(Stable(gen=1)) is False  # closed: still no exception
