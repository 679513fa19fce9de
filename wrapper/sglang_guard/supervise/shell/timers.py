"""The loop's timers: a heap of due `Tick`s that the loop itself serves between events.

No thread of their own: the loop (supervise/shell/supervisor.Supervisor._next_event) waits on
its event queue no longer than the next due time, and puts each tick that fell due on the
queue before it takes the next event, behind whatever came before it. Only the loop's
thread schedules. A timer thread would wake, and take the GIL and a core, at every schedule:
the settle timer a crash banner asks for fell between the banner and the fatal line behind
it, on the reaction's path (bench/README.md, "Reaction, fifth round").
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable

from sglang_guard.supervise.events import Tick


class Timers:
    """A heap of due times, served by whoever asks `due` (the loop)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, Tick]] = []
        self._order = itertools.count()  # ties keep scheduling order

    def schedule(self, delay: float, tick: Tick) -> None:
        """`tick` falls due `delay` seconds from now."""
        heapq.heappush(self._heap, (self._clock() + max(0.0, delay), next(self._order), tick))

    def forget_before(self, gen: int) -> None:
        """Drop the pending ticks of launches older than `gen` (they would be ignored)."""
        self._heap = [entry for entry in self._heap if entry[2].gen >= gen]
        heapq.heapify(self._heap)

    def due(self, now: float) -> list[Tick]:
        """The ticks due at `now`, in due order (and scheduling order among equals)."""
        out: list[Tick] = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def next_due(self) -> float | None:
        """When the next tick falls due (the clock's time); None: none pending."""
        return self._heap[0][0] if self._heap else None

    def close(self) -> None:
        """Drop the pending ticks."""
        self._heap.clear()
