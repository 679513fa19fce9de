"""Slow steps off the loop: each runs on a thread of its own, its result comes back as an event.

The supervision loop must answer a signal, a /livez tick and the watchdog's period at once,
whatever else is going on; so every wait or slow step (the port wait before a relaunch, a
reload's preflight and model probe, a rule pack's compile, the orphan clean-up) is a job, the
way the health probe already was. A job's `work` runs on its thread and may watch its cancel
event; `JobDone` goes on the loop's queue when it ends, and the loop, on its own thread,
calls `finish`, which hands the result (or re-raises the error) to the job's `done`.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sglang_guard.supervise.events import Event, JobDone

T = TypeVar("T")
Work = Callable[[threading.Event], T]  # the slow step; the event is set when it is cancelled
JOIN_S = 0.2  # at the end of a run: how long a job still running is waited for, each
# Subprocesses a slow step runs (the model probe): killed when the loop ends under them.
_PROCESSES: set[subprocess.Popen[Any]] = set()
_PROCESSES_LOCK = threading.Lock()


@contextlib.contextmanager
def tracked(proc: subprocess.Popen[Any]) -> Iterator[subprocess.Popen[Any]]:
    """While inside, `proc` is killed by `Jobs.close` (the run ended with a job waiting on it)."""
    with _PROCESSES_LOCK:
        _PROCESSES.add(proc)
    try:
        yield proc
    finally:
        with _PROCESSES_LOCK:
            _PROCESSES.discard(proc)


def kill_tracked() -> None:
    """Kill every tracked subprocess still running."""
    with _PROCESSES_LOCK:
        procs = list(_PROCESSES)
    for proc in procs:
        with contextlib.suppress(OSError):
            proc.kill()


@dataclass
class _Job(Generic[T]):
    name: str
    work: Work[T]
    done: Callable[[T], int | None]
    cancel: threading.Event = field(default_factory=threading.Event)
    result: list[T] = field(default_factory=list)
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def run(self, number: int, events: queue.Queue[Event]) -> None:
        try:
            self.result.append(self.work(self.cancel))
        except BaseException as exc:  # re-raised on the loop's thread, where it always was
            self.error = exc
        finally:
            events.put(JobDone(number))

    def hand_over(self) -> int | None:
        if self.error is not None:
            raise self.error
        return self.done(self.result[0])


class Jobs:
    """The jobs of one supervision loop."""

    def __init__(self, events: queue.Queue[Event]) -> None:
        self._events = events
        self._numbers = itertools.count(1)
        self._running: dict[int, _Job[object]] = {}

    def start(self, name: str, work: Work[T], done: Callable[[T], int | None]) -> int:
        """Run `work` on a thread; on its JobDone the loop's `finish` calls `done(result)`."""
        number = next(self._numbers)
        job: _Job[T] = _Job(name, work, done)
        thread = threading.Thread(target=job.run, args=(number, self._events),
                                  name=f"job-{name}", daemon=True)
        job.thread = thread
        self._running[number] = job  # type: ignore[assignment]  # T is erased at rest
        thread.start()
        return number

    def running(self, name: str) -> bool:
        """Whether a job of this name is still running."""
        return any(job.name == name for job in self._running.values())

    def cancel(self, number: int) -> None:
        """Forget the job (its JobDone will be ignored) and tell its work to stop."""
        job = self._running.pop(number, None)
        if job is not None:
            job.cancel.set()

    def finish(self, event: JobDone) -> int | None:
        """On the loop's thread: the job's `done`, with its result; an exit status or None."""
        job = self._running.pop(event.job, None)
        return None if job is None else job.hand_over()

    def close(self) -> None:
        """Cancel every job still running; wait for each briefly (their threads are daemons:
        a step that cannot be interrupted, such as a model probe, does not hold the exit)."""
        jobs = list(self._running.values())
        self._running.clear()
        for job in jobs:
            job.cancel.set()
        if jobs:
            kill_tracked()  # the model probe a reload waits on: it must not outlive the guard
        for job in jobs:
            if job.thread is not None:
                job.thread.join(JOIN_S)
