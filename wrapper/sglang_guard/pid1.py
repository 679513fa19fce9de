"""A minimal init in front of the guard when the guard is PID 1 (a leaf: imports no entry).

In a container without an init (a Kubernetes pod's first process, `docker run` without
`--init`) the guard is PID 1: every process orphaned in the container is reparented to it,
and the kernel delivers it no signal that has no handler. SGLang's own processes are reaped
by the guard's supervisor, but an orphan (a scheduler whose parent died, a `kubectl exec`
shell's child) would stay a zombie for ever. So as PID 1 the guard forks once: the parent is
the init (it forwards every stop signal to the guard and reaps every process that ends),
the child is the guard, with nothing changed. Not PID 1: the guard runs as it is.
"""

from __future__ import annotations

import contextlib
import os
import sys

# Signals the init passes on to the guard (SIGKILL and SIGSTOP cannot be caught), by name:
# `signal` is imported only by an init (its enums are ~0.7 ms of every command's start).
FORWARD = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH",
           "SIGCONT")
ENV_NO_INIT = "SGLANG_GUARD_NO_INIT"  # "1": never fork an init, even as PID 1


def exit_status(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128 + the signal."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def run_as_init(guard: int) -> int:
    """Be the init of the PID namespace: forward signals to `guard`, reap every process, and
    exit as `guard` exits."""
    import signal  # noqa: PLC0415 - an init's alone (FORWARD)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            os.kill(guard, signum)

    for name in FORWARD:
        signal.signal(getattr(signal, name), forward)
    while True:
        try:
            pid, status = os.wait()  # any child: the guard, or an orphan reparented here
        except ChildProcessError:
            return 0
        if pid == guard:
            return exit_status(status)


def init_if_pid1() -> None:
    """As PID 1, fork: this process stays as the init and never returns; the child returns
    and runs the guard."""
    if os.getpid() != 1 or os.environ.get(ENV_NO_INIT) == "1":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    guard = os.fork()
    if guard == 0:
        return
    os._exit(run_as_init(guard))
