"""The guard's own files: never written through a planted symlink; private where secrets go."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sglang_guard.common.shell.files import read_bytes, write_atomic, write_private
from sglang_guard.supervise.shell.journal import Journal


def test_a_symlink_at_the_old_predictable_temp_name_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "state" / "child.pgid"
    target.parent.mkdir()
    (target.parent / f".child.pgid.{os.getpid()}.tmp").symlink_to(victim)
    write_atomic(target, "{}")
    assert victim.read_text() == "precious"
    assert target.read_text() == "{}"


def test_a_symlink_at_the_target_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "child.pgid"
    target.symlink_to(victim)
    write_atomic(target, "{}")
    assert victim.read_text() == "precious"
    assert not target.is_symlink()


def test_nofollow_reads_refuse_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert read_bytes(link) == b"x"  # the user's own files may be symlinks
    with pytest.raises(OSError):
        read_bytes(link, nofollow=True)


def test_a_planted_journal_symlink_gets_nothing_appended(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "journal.jsonl").symlink_to(victim)
    with pytest.raises(Exception, match="state dir is not writable"):
        Journal.open(str(state))
    assert victim.read_text() == "precious\n"


def test_private_files_are_0600_in_a_0700_dir_or_stricter_like_the_users(tmp_path: Path) -> None:
    old = os.umask(0)  # the modes must not depend on the caller's umask
    try:
        user = tmp_path / "user.yaml"
        user.write_text("api-key: k\n")
        user.chmod(0o400)
        write_private(tmp_path / "derived" / "a.yaml", "api-key: k\n")
        write_private(tmp_path / "derived" / "b.yaml", "api-key: k\n", like=user)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "derived").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "derived" / "a.yaml").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "derived" / "b.yaml").stat().st_mode) == 0o400
