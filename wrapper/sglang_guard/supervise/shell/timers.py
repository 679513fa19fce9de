"""One timer thread for the whole loop: `Tick`s put on the event queue when they fall due.

A `threading.Timer` per schedule would leave a sleeping thread behind for every launch
(a one-hour ready timeout, a five-minute stable timer); a crash loop would pile them up.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable

from sglang_guard.supervise.events import Event, Tick


class Timers:
    """A heap of due times served by one daemon thread."""

    def __init__(self, events: queue.Queue[Event], clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._events = events
        self._clock = clock
        self._heap: list[tuple[float, int, Tick]] = []
        self._order = itertools.count()  # ties keep scheduling order
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="timers", daemon=True)
        self._thread.start()

    def schedule(self, delay: float, tick: Tick) -> None:
        """Put `tick` on the queue `delay` seconds from now."""
        with self._cond:
            heapq.heappush(self._heap, (self._clock() + max(0.0, delay), next(self._order), tick))
            self._cond.notify()

    def forget_before(self, gen: int) -> None:
        """Drop the pending ticks of launches older than `gen` (they would be ignored)."""
        with self._cond:
            self._heap = [entry for entry in self._heap if entry[2].gen >= gen]
            heapq.heapify(self._heap)

    def close(self) -> None:
        """Stop the thread; pending ticks are dropped."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if not self._heap:
                    self._cond.wait()
                    continue
                due, _, tick = self._heap[0]
                wait = due - self._clock()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                self._events.put(tick)
