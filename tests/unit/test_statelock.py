"""One guard per state dir (supervise/shell/statelock.py): the lock, the dir's mode, the default per
port."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_guard.errors import InputError
from sglang_guard.supervise.shell.statelock import (
    default_run_state_dir,
    ensure_state_dir,
    hold_state_dir,
    parse_port,
)


def test_a_second_holder_is_refused_with_the_dir_and_the_holders_pid(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with hold_state_dir(str(state)):
        with pytest.raises(InputError) as err, hold_state_dir(str(state)):
            pass
        assert str(state) in str(err.value)
        assert f"pid {os.getpid()}" in str(err.value)
        assert "\n" not in str(err.value)
    with hold_state_dir(str(state)):  # released when the holder is done
        pass


def test_the_state_dir_is_created_0700_and_refused_when_others_may_write(tmp_path: Path) -> None:
    made = ensure_state_dir(str(tmp_path / "a" / "state"))
    assert made.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    for mode in (0o777, 0o1777, 0o770):  # a kubelet's emptyDir is 0777
        shared.chmod(mode)
        used = ensure_state_dir(str(shared))
        assert used == shared / f"sglang-guard-{os.geteuid()}"
        assert used.lstat().st_mode & 0o777 == 0o700
    (shared / f"sglang-guard-{os.geteuid()}").chmod(0o755)  # loosened: made 0700 again
    assert ensure_state_dir(str(shared)).stat().st_mode & 0o777 == 0o700
    shared.chmod(0o755)
    assert ensure_state_dir(str(shared)) == shared


def test_in_a_shared_dir_a_planted_symlink_or_another_users_dir_is_refused(
        tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (shared / f"sglang-guard-{os.geteuid()}").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InputError, match="symlink"):
        ensure_state_dir(str(shared))
    (shared / f"sglang-guard-{os.geteuid()}").unlink()
    (shared / f"sglang-guard-{os.geteuid()}").mkdir(mode=0o700)
    if os.geteuid() == 0:  # root can hand the dir to another user
        os.chown(shared / f"sglang-guard-{os.geteuid()}", 4242, 4242)
        with pytest.raises(InputError, match="owned by uid 4242"):
            ensure_state_dir(str(shared))


def test_the_default_state_dir_names_the_instance_by_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SGLANG_GUARD_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    a = default_run_state_dir(["--model-path", "m", "--port", "31000"])
    b = default_run_state_dir(["--model-path", "m", "--por=31001"])  # argparse abbreviation
    c = default_run_state_dir(["--model-path", "m"])
    assert a == str(tmp_path / "sglang-guard" / "port-31000")
    assert b == str(tmp_path / "sglang-guard" / "port-31001")
    assert c == str(tmp_path / "sglang-guard" / "port-30000")
    monkeypatch.setenv("SGLANG_GUARD_STATE_DIR", str(tmp_path / "mine"))
    assert default_run_state_dir(["--port", "31000"]) == str(tmp_path / "mine")  # as given


@pytest.mark.parametrize("raw", ["notaport", "", "70000", "0", "3e4"])
def test_a_port_sglang_would_reject_is_an_input_error(raw: str) -> None:
    with pytest.raises(InputError, match="not a port number"):
        parse_port(raw)
    assert parse_port(None) == 30000
    assert parse_port(" 31000") == 31000
