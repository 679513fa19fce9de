"""The guard config and a rule pack damaged: corrupted, deleted, a directory, a dangling
symlink, a FIFO -- at start, and while SGLang runs (the files are watched).

Tests run as root, so `chmod 000` would not stop the guard from reading: "unreadable" is
made with what stops root too -- a directory, a dangling symlink, a FIFO with no writer.

What must hold:
- at start: exit 2 within seconds, one clear line naming the file, no traceback, nothing
  launched;
- while running: the change is rejected with a clear message in the journal, SGLang is not
  restarted, and the last good config stays in force -- a fatal line after the damage is
  still fixed with the old rules.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.errors import EXIT_OK, EXIT_USAGE
from sglang_guard.supervise.machine import READY_LINE
from support.guards import Guard, argv_for, finish, guard_toml, leftovers
from support.harness import HealthServer, Launcher, count, journal_events, wait_for
from support.pack import FA3_LINE
from support.procs import free_port


def _garbage(path: Path) -> None:
    path.write_bytes(b"\xff\xfe\x00[restart\x00\x80 max_failures = \xc3(\n")


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2] + b"\n[[rules\n")


def _deleted(path: Path) -> None:
    path.unlink()


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _dangling(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.with_name("nowhere.toml"))


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


DAMAGE: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    # how -> (do it, words one of which the message must hold)
    "garbage bytes": (_garbage, ("cannot read", "not valid TOML", "utf-8", "UTF-8")),
    "truncated": (_truncated, ("not valid TOML",)),
    "deleted": (_deleted, ("not found", "No such file")),
    "directory": (_directory, ("directory",)),
    "dangling symlink": (_dangling, ("not found", "No such file")),
    "fifo": (_fifo, ("not a regular file", "FIFO", "fifo")),
}
FILES = ("guard_config", "rule_pack")


def _rejections(state: Path) -> list[dict[str, Any]]:
    return [r for r in journal_events(state) if r["event"] == "reload.rejected"]


def _undo(path: Path, good: bytes) -> None:
    """Put the good file back, whatever is there now."""
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.write_bytes(good)


@pytest.mark.parametrize("how", list(DAMAGE))
@pytest.mark.parametrize("which", FILES)
def test_damaged_file_at_start_exits_2_with_a_clear_message(
        tmp_path: Path, pack: Path, guard: Guard, which: str, how: str) -> None:
    launcher = Launcher(tmp_path, [[["exit", 0]]])
    config = guard_toml(tmp_path, launcher, pack)
    target = config if which == "guard_config" else pack
    damage, words = DAMAGE[how]
    damage(target)
    code, _, err = finish(guard(config, argv_for(free_port())), timeout=10)
    assert code == EXIT_USAGE, err
    assert str(target) in err
    assert any(w in err for w in words), err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert launcher.argvs() == []


@pytest.mark.parametrize("which", FILES)
def test_damaged_file_while_running_keeps_the_last_good_config(
        tmp_path: Path, pack: Path, guard: Guard, which: str) -> None:
    go = tmp_path / "go"
    launcher = Launcher(tmp_path, [
        [["print", "stdout", READY_LINE], ["wait_file", str(go)], ["print", "stderr", FA3_LINE],
         ["wait_term"], ["exit", 0]],
        [["print", "stdout", READY_LINE], ["wait_term"], ["exit", 0]],
    ])
    state = tmp_path / "state"
    with HealthServer() as server:
        config = guard_toml(tmp_path, launcher, pack, max_failures=3, stop_grace_s=0.5)
        target = config if which == "guard_config" else pack
        good = target.read_bytes()
        proc = guard(config, argv_for(server.port, "--attention-backend", "fa3"))
        wait_for(lambda: count(state, "ready") >= 1, what="ready")
        for n, how in enumerate([h for h in DAMAGE if h != "fifo"], start=1):
            damage, words = DAMAGE[how]
            _undo(target, good)  # each damage starts from the good file
            damage(target)
            rejected = wait_for(lambda: _rejections(state)[n - 1:],  # noqa: B023 - used at once
                                what=f"rejection of {how}")
            error = str(rejected[0]["error"])
            assert str(target) in error, (how, error)
            assert any(w in error for w in words), (how, error)
            assert proc.poll() is None
        go.touch()  # the fatal line, with the last good rules in force
        wait_for(lambda: count(state, "ready") >= 2, what="ready after the fix")
        _undo(target, good)
        proc.send_signal(signal.SIGTERM)
        code, _, err = finish(proc)
    assert code == EXIT_OK, err
    assert "Traceback" not in err
    assert [r["rule"] for r in journal_events(state) if r["event"] == "remediated"] == ["fa3-sm"]
    assert count(state, "child.start") == 2  # the damage restarted nothing; the fix did, once
    assert "fa3" not in launcher.argvs()[1]
    assert leftovers(launcher) == []


@pytest.mark.parametrize("which", FILES)
def test_file_replaced_by_a_fifo_while_running_does_not_hang_the_guard(
        tmp_path: Path, pack: Path, guard: Guard, which: str) -> None:
    launcher = Launcher(tmp_path, [[["print", "stdout", READY_LINE], ["wait_term"], ["exit", 0]]])
    state = tmp_path / "state"
    with HealthServer() as server:
        config = guard_toml(tmp_path, launcher, pack, max_failures=3, stop_grace_s=0.5)
        target = config if which == "guard_config" else pack
        proc = guard(config, argv_for(server.port))
        wait_for(lambda: count(state, "ready") >= 1, what="ready")
        _fifo(target)
        wait_for(lambda: count(state, "reload.rejected") >= 1, timeout=5,
                 what="the FIFO rejected (a reader that blocks on it hangs the loop)")
        proc.send_signal(signal.SIGTERM)
        code, _, err = finish(proc, timeout=10)
    assert code == EXIT_OK, err
    assert leftovers(launcher) == []
