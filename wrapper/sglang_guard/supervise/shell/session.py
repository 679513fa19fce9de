"""`run` as the CLI and the drop-in call it: one guard per state dir, signals from the start."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import NoReturn

from sglang_guard.common.outcomes import GuardExit
from sglang_guard.common.shell import stderrgate
from sglang_guard.common.shell.logsetup import get_logger
from sglang_guard.config.guardconfig import GuardConfig
from sglang_guard.errors import ConfigError
from sglang_guard.preflight.shell.inputs import read_command_line
from sglang_guard.status.shell.status import serving
from sglang_guard.supervise.shell import runner
from sglang_guard.supervise.shell.journal import Journal
from sglang_guard.supervise.shell.statelock import StateDirUnavailable, hold_state_dir, parse_port
from sglang_guard.supervise.shell.stopsignals import EarlyStop, early_signals

Run = Callable[[GuardConfig, "runner.RunOptions"], int]


def run_guarded(cfg: GuardConfig, opts: runner.RunOptions, run: Run = runner.run) -> int:
    """`run` (`runner.run`, or it wrapped in the status port) under the state-dir lock; a
    stop signal before supervision exits 0."""
    try:
        return _run_locked(cfg, opts, run)
    finally:
        stderrgate.gate().release()  # events that waited for an unfinished SGLang line



def run_with_status(cfg: GuardConfig, opts: runner.RunOptions) -> int:
    """`runner.run` with the status port up around it (the CLI's `run`, `serve`, the drop-in)."""
    with serving(cfg.status, opts.argv) as board:
        board.announce_to = opts.state_dir
        return runner.run(cfg, replace(opts, observer=board))

def exit_process(code: int) -> NoReturn:
    """Exit with `code`; at once when a pump thread is still stuck on a blocked stdout.

    Such a thread holds the stdout buffer's lock, and the interpreter's own exit would wait on
    it (or abort): the stop grace has passed already, so nothing more can be written anyway.
    """
    stuck = [t for t in threading.enumerate() if t.daemon and t.name.endswith("-writer")]
    if stuck:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _run_locked(cfg: GuardConfig, opts: runner.RunOptions, run: Run) -> int:
    with early_signals(), contextlib.ExitStack() as held:
        try:
            try:
                # the dir the files go in: a subdirectory of a dir others may write (emptyDir)
                used = held.enter_context(hold_state_dir(opts.state_dir))
                opts = replace(opts, state_dir=str(used))
            except StateDirUnavailable as exc:  # no dir, no shared files: run without one
                get_logger().error("state_dir.unavailable", error=str(exc))
        except EarlyStop:  # before the lock was ours: nothing started, nothing to journal
            return 0
        try:
            # SGLang's parser rejects a --port that is not a number; so does the guard,
            # before its port check would test SGLang's default port instead.
            parse_port(read_command_line(opts.argv).value("port"))
            return run(cfg, opts)
        except EarlyStop as stop:
            _journal_exit(opts.state_dir, f"{stop} before launch")
            return 0


def _journal_exit(state_dir: str, reason: str) -> None:
    get_logger().info("guard.exit", code=0, reason=reason)
    try:
        journal = Journal.open(state_dir)
    except ConfigError:
        return
    journal.write(GuardExit(code=0, reason=reason))
    journal.close()
