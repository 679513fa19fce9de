"""What the supervision loop tells those who follow it: one `Listener` interface, no replies.

The status board (status/shell/status.py), fleet memory (fleet/shell/fleet.py), a group's leader or
worker
link (group/shell/groupleader.py, group/shell/groupworker.py) and the journal writer are all
listeners
of the loop (supervise/shell/supervisor.py): it calls `start` once with its queue, `saw_event`
before
each machine step, `stepped` after it, `saw_action` before each action, `record` for every
journal event (one fan-out: `Supervisor._record`), and `close` when the loop ends. A
listener must return quickly; `Quiet` does nothing, so a listener implements only what it
needs, and `NO_OBSERVER` lets the loop run the same with the status port off.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sglang_guard.common.outcomes import JournalEvent
    from sglang_guard.supervise.actions import Action
    from sglang_guard.supervise.events import Event
    from sglang_guard.supervise.machine import Env, State


class Listener(Protocol):
    """The hooks the supervisor (and, for preflight's records, the runner) calls."""

    def start(self, events: queue.Queue[Event]) -> None:
        """The loop's event queue (a link's threads, /livez: events the loop must take)."""

    def saw_event(self, event: Event, state: State) -> None:
        """An event is about to be stepped."""

    def stepped(self, state: State, env: Env, actions: Sequence[Action]) -> None:
        """The machine stepped: its new state and the actions about to be carried out."""

    def saw_action(self, action: Action, state: State) -> None:
        """An action is about to be carried out (`state`: the machine's state after the step)."""

    def record(self, event: JournalEvent) -> None:
        """A journal event (written or not: the journal may be unavailable)."""

    def close(self) -> None:
        """The loop ended (a leader lets its workers hear how)."""


class Quiet:
    """A listener that ignores everything: the base of those that need only some hooks."""

    def start(self, events: queue.Queue[Event]) -> None:
        """Ignore."""

    def saw_event(self, event: Event, state: State) -> None:
        """Ignore."""

    def stepped(self, state: State, env: Env, actions: Sequence[Action]) -> None:
        """Ignore."""

    def saw_action(self, action: Action, state: State) -> None:
        """Ignore."""

    def record(self, event: JournalEvent) -> None:
        """Ignore."""

    def close(self) -> None:
        """Ignore."""


NO_OBSERVER: Listener = Quiet()
