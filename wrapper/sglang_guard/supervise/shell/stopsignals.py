"""SIGTERM/SIGINT before the supervision loop takes over: stop what was started, exit 0.

Until `Supervisor.run` installs its own handlers (which only enqueue), the guard is in
straight-line code: reading inputs, probing the model in a subprocess, cleaning up orphans.
There a signal raises `EarlyStop` in the main thread, which unwinds through that code
(`subprocess.run` kills its child on any exception) to `session.run_guarded`, which journals
`guard.exit` and returns 0, as a signal during supervision does. Once the loop has its
handlers, this one is disarmed; restored by the loop on its way out, it ignores a second
signal rather than abort the loop's final stop of SGLang's tree half-way.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

HANDLED = (signal.SIGTERM, signal.SIGINT)


class EarlyStop(BaseException):
    """A stop signal arrived before the supervision loop started."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_armed = False


def _handler(signum: int, _frame: Any) -> None:
    global _armed  # noqa: PLW0603 - a signal handler has nowhere else to keep it
    if _armed:
        _armed = False  # once: the unwinding must not be interrupted by a second signal
        raise EarlyStop(signum)


def disarm() -> None:
    """The supervision loop has its own handlers now: never raise from here again."""
    global _armed  # noqa: PLW0603
    _armed = False


@contextlib.contextmanager
def early_signals() -> Iterator[None]:
    """Turn SIGTERM/SIGINT into EarlyStop while the block runs (main thread only)."""
    global _armed  # noqa: PLW0603
    old = {s: signal.signal(s, _handler) for s in HANDLED}
    _armed = True
    try:
        yield
    finally:
        _armed = False
        for s, handler in old.items():
            signal.signal(s, handler)
