"""What the supervision loop tells an onlooker (the status port): three calls, no replies.

The loop calls `attach` once, `step` after every machine step and `record` for every
journal record; an observer must return quickly and never raise. `NO_OBSERVER` does
nothing, so the loop runs the same with the status port off.
"""

from __future__ import annotations

import queue
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sglang_guard.core.actions import Action
    from sglang_guard.core.events import Event
    from sglang_guard.core.machine import Env, State


class Observer(Protocol):
    """The hooks the supervisor and the runner call."""

    def attach(self, events: queue.Queue[Event]) -> None:
        """The loop's event queue (for /livez: an event the loop must take)."""

    def step(self, state: State, env: Env, actions: Sequence[Action]) -> None:
        """The machine stepped: its new state and the actions about to be carried out."""

    def record(self, record: Mapping[str, Any]) -> None:
        """A journal record (written or not: the journal may be unavailable)."""


class _Nothing:
    """An observer that ignores everything."""

    def attach(self, events: queue.Queue[Event]) -> None:
        """Ignore."""

    def step(self, state: State, env: Env, actions: Sequence[Action]) -> None:
        """Ignore."""

    def record(self, record: Mapping[str, Any]) -> None:
        """Ignore."""


NO_OBSERVER: Observer = _Nothing()
