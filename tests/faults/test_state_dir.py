"""The state dir fails: a journal that hits /dev/full, a tmpfs that fills up mid-run.

What must hold: the guard keeps supervising (a fatal line is still fixed and the fixed child
reaches ready), the child's output still flows, the failure is said once in a clear message
(`journal.write_failed` with the OS's reason), the journal that was written stays readable,
and SIGTERM still ends the run with 0 and no process left.

The tmpfs variant needs `mount` (root with CAP_SYS_ADMIN); elsewhere they are skipped.
(Tests run as root, so permission bits cannot make a directory unwritable: a full file
system can. Remounting read-only is refused while the journal is open for writing. A state
dir that cannot be created at all is tests/integration/test_cli_run.py's case.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_guard.errors import EXIT_GIVE_UP, EXIT_OK, EXIT_USAGE
from sglang_guard.supervise.machine import READY_LINE
from support.guards import GuardRun, argv_for, guard_toml, leftovers
from support.harness import HealthServer, Launcher, count, journal_events, ready_then_wait, wait_for
from support.pack import FA3_LINE
from support.procs import free_port


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted under tmp_path (skipped where mounting is not permitted)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN): "
                    f"{done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(directory: Path, journal: Path) -> None:
    """Write until the file system says ENOSPC, the journal's last page included.

    tmpfs allocates whole pages: the journal's last page still has room after the ballast
    took every free one, so it is topped up with empty lines (readers skip those).
    """
    block = b"\0" * 65536
    with contextlib.suppress(OSError), (directory / "ballast").open("wb") as fh:
        while True:
            fh.write(block)
            fh.flush()
    room = -journal.stat().st_size % os.sysconf("SC_PAGE_SIZE")
    with contextlib.suppress(OSError), journal.open("ab") as fh:
        fh.write(b"\n" * room)


def _fix_survives(tmp_path: Path, pack: Path, state: Path, start_guard: type[GuardRun],
                  break_it: object) -> tuple[str, list[str]]:
    """Ready, break the state dir (`break_it()`), then a fatal line: the fix must still happen.

    Returns the guard's stderr and the child's argv per launch.
    """
    go = tmp_path / "go"
    launcher = Launcher(tmp_path, [
        [["print", "stdout", READY_LINE], ["wait_file", str(go)],
         ["print", "stdout", "output after the disk broke"], ["print", "stderr", FA3_LINE],
         ["wait_term"], ["exit", 0]],
        [["print", "stdout", "second launch"], *ready_then_wait()],
    ])
    with HealthServer() as server:
        config = guard_toml(tmp_path, launcher, pack, max_failures=2, stop_grace_s=0.5)
        run = start_guard(tmp_path, config, argv_for(server.port, "--attention-backend", "fa3"),
                          state)
        wait_for(lambda: b"fired up" in run.stdout_path.read_bytes(), what="first ready line")
        break_it()  # type: ignore[operator]
        go.touch()
        wait_for(lambda: b"second launch" in run.stdout_path.read_bytes() and
                 run.stdout_path.read_bytes().count(READY_LINE.encode()) == 2,
                 what="the fixed launch")
        run.proc.send_signal(signal.SIGTERM)
        code, out, err = run.wait(30)
    assert code == EXIT_OK, err
    assert b"output after the disk broke" in out
    argvs = launcher.argvs()
    assert len(argvs) == 2
    assert "fa3" in argvs[0]
    assert "fa3" not in argvs[1]  # the fix was applied with the journal gone
    assert leftovers(launcher) == []
    return err, argvs[1]


def test_journal_on_dev_full_supervision_goes_on(
        tmp_path: Path, pack: Path, start_guard: type[GuardRun]) -> None:
    state = tmp_path / "state"
    state.mkdir()
    # /dev/full's own device node, not a symlink to it: the journal is opened O_NOFOLLOW
    full = Path("/dev/full").stat()
    try:
        os.mknod(state / "journal.jsonl", stat.S_IFCHR | 0o600, full.st_rdev)
    except PermissionError as exc:
        pytest.skip(f"cannot make a device node here (needs CAP_MKNOD): {exc}")
    err, _ = _fix_survives(tmp_path, pack, state, start_guard, lambda: None)
    assert err.count('"journal.write_failed"') == 1, err  # said once, not per event
    assert "No space left on device" in err
    assert "Traceback" not in err


def test_state_dir_fills_up_mid_run_supervision_goes_on(
        tmp_path: Path, pack: Path, start_guard: type[GuardRun], tiny_tmpfs: Path) -> None:
    state = tiny_tmpfs / "state"

    def break_it() -> None:
        wait_for(lambda: count(state, "ready") >= 1, what="the journal's first events")
        fill(tiny_tmpfs, state / "journal.jsonl")

    err, _ = _fix_survives(tmp_path, pack, state, start_guard, break_it)
    assert err.count('"journal.write_failed"') == 1, err
    assert "No space left on device" in err
    assert "Traceback" not in err
    # What was written before the disk filled up is still readable, in order.
    assert [r["event"] for r in journal_events(state)
            if r["event"] != "status.listening"] == ["child.start", "ready"]
    # Once there is room again, a new guard appends to the same journal.
    (tiny_tmpfs / "ballast").unlink()
    (tmp_path / "again").mkdir()
    launcher = Launcher(tmp_path / "again", [[["exit", 0]]])
    run = start_guard(tmp_path / "again", guard_toml(tmp_path / "again", launcher, pack),
                      argv_for(free_port()), state)
    assert run.wait(30)[0] == EXIT_GIVE_UP
    events = [r["event"] for r in journal_events(state) if r["event"] != "status.listening"]
    assert events[:2] == ["child.start", "ready"]
    assert events[-1] == "guard.exit"


def test_a_second_guard_on_the_same_state_dir_exits_2_and_leaves_the_first_alone(
        tmp_path: Path, pack: Path, start_guard: type[GuardRun]) -> None:
    state = tmp_path / "state"
    launcher = Launcher(tmp_path, [ready_then_wait()])
    with HealthServer() as server:
        config = guard_toml(tmp_path, launcher, pack, stop_grace_s=0.5)
        first = start_guard(tmp_path, config, argv_for(server.port), state)
        wait_for(lambda: count(state, "ready") >= 1, what="the first guard's server ready")
        second = start_guard(tmp_path / "second", config, argv_for(server.port), state)
        code, _, err = second.wait(30)
        assert code == EXIT_USAGE, err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert str(state) in lines[0] and f"pid {first.proc.pid}" in lines[0], lines[0]
        # the first guard's server was not touched: still one launch, still running
        assert first.proc.poll() is None
        assert len(launcher.argvs()) == 1
        assert "orphans.stopped" not in [r["event"] for r in journal_events(state)]
        first.proc.send_signal(signal.SIGTERM)
        code, _, err = first.wait(30)
    assert code == EXIT_OK, err
    assert leftovers(launcher) == []


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_a_state_dir_others_may_write_keeps_the_files_in_a_private_subdir(
        tmp_path: Path, pack: Path, start_guard: type[GuardRun], mode: int) -> None:
    """A kubelet's emptyDir is 0777: the guard runs, its files in a 0700 dir of its own."""
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(mode)
    launcher = Launcher(tmp_path, [[["exit", 0]]])
    run = start_guard(tmp_path, guard_toml(tmp_path, launcher, pack), argv_for(free_port()),
                      state)
    run.wait(30)
    assert len(launcher.argvs()) >= 1  # it launched
    own = state / f"sglang-guard-{os.geteuid()}"
    assert own.lstat().st_mode & 0o777 == 0o700
    assert (own / "journal.jsonl").is_file() and (own / "guard.lock").is_file()
    assert sorted(p.name for p in state.iterdir()) == [own.name]  # nothing beside it


def test_a_planted_private_subdir_in_a_shared_state_dir_is_refused_with_one_line(
        tmp_path: Path, pack: Path, start_guard: type[GuardRun]) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    (tmp_path / "elsewhere").mkdir()
    (state / f"sglang-guard-{os.geteuid()}").symlink_to(tmp_path / "elsewhere")
    launcher = Launcher(tmp_path, [ready_then_wait()])
    run = start_guard(tmp_path, guard_toml(tmp_path, launcher, pack), argv_for(free_port()),
                      state)
    code, _, err = run.wait(30)
    assert code == EXIT_USAGE, err
    assert err.count("\n") == 1 and "symlink" in err, err
    assert launcher.argvs() == []  # nothing launched


def test_planted_symlinks_in_the_state_dir_are_never_written_through(
        tmp_path: Path, pack: Path, start_guard: type[GuardRun]) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (state / "journal.jsonl").symlink_to(victim)
    (state / "child.pgid").symlink_to(victim)
    launcher = Launcher(tmp_path, [ready_then_wait()])
    with HealthServer() as server:
        run = start_guard(tmp_path, guard_toml(tmp_path, launcher, pack, stop_grace_s=0.3),
                          argv_for(server.port), state)
        wait_for(lambda: b"fired up" in run.stdout_path.read_bytes(), what="ready line")
        run.proc.send_signal(signal.SIGTERM)
        code, _, err = run.wait(30)
    assert code == EXIT_OK, err
    assert victim.read_text() == "precious\n"
    assert "journal.unavailable" in err  # said once; supervision went on without it
    assert not [p for p in state.iterdir() if p.name.endswith(".tmp")]
