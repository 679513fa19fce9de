"""The supervision loop's event queue, which knows when the loop has caught up.

Every event is put here and taken by the loop thread alone, which calls `task_done` once it
has stepped the event and carried out what the step asked for (supervise/shell/supervisor.py).
So, under the queue's lock, `unfinished_tasks == 0` says: the loop has stepped every event
ever put, its state is the one the next event will be stepped from, and nothing is queued.

`put_lines` uses that for a pipe reader's early stop (supervise/shell/child.py): with the
lock held it asks whether the loop is caught up and, if it is, whether stepping the lines
from the loop's state stops the child (supervise/machine.stops_at); then it queues them in
the same hold. No other event can come between that answer and the lines, so the loop steps
them from the state the answer read, and decides what the answer said. The reader sends the
SIGTERM outside the lock, before it wakes the loop: the loop's steps then do not compete
with the stop for the GIL and the CPU (measured: bench/README.md, "Reaction, seventh round");
woken, the loop lets the child's main process end first, for a few milliseconds at most
(supervise/shell/child.py, END_WAIT_S).
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence

from sglang_guard.supervise.events import Event


class EventQueue(queue.Queue[Event]):
    """An unbounded queue of events; `put_lines` puts several at once, deciding first."""

    def __init__(self) -> None:
        super().__init__()  # unbounded: a reader never waits on the loop

    def put_lines(self, items: Sequence[Event], decide: Callable[[], bool],
                  act: Callable[[], None]) -> None:
        """Queue `items` in order, with no event between them. If the loop had stepped every
        event before them and `decide()` is True, call `act()` before the loop is told
        of them (`decide` runs under the queue's lock: it must be quick and put nothing;
        an exception it raises counts as False; `act`'s own propagates, the items queued)."""
        if not items:
            return
        with self.mutex:
            fire = False
            if self.unfinished_tasks == 0:
                try:
                    fire = decide()
                except Exception:  # the loop's own step meets it again, and says so
                    fire = False
            for item in items:
                self._put(item)
            self.unfinished_tasks += len(items)
        try:
            if fire:
                act()
        finally:
            with self.mutex:
                self.not_empty.notify()
