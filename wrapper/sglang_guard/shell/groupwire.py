"""The group's wire: what the supervisor calls on a link, and one JSON POST between guards."""

from __future__ import annotations

import http.client
import json
import queue
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sglang_guard.core import group as core
from sglang_guard.core.actions import Action
from sglang_guard.core.events import Event
from sglang_guard.core.machine import State

Clock = Callable[[], float]


class Link(Protocol):
    """What the supervisor calls: start with its queue, see events and actions, close."""

    def start(self, events: queue.Queue[Event]) -> None:
        """Start the link's threads; they put events on `events`."""

    def saw_event(self, event: Event, state: State) -> None:
        """An event is about to be stepped."""

    def saw_action(self, action: Action, state: State) -> None:
        """An action is about to be carried out (`state`: the machine's state after the step)."""

    def close(self) -> None:
        """Stop the threads (the leader first lets its workers hear how it ended)."""


# -- HTTP -----------------------------------------------------------------------------------


def post(host: str, port: int, path: str, body: Mapping[str, Any], timeout: float
         ) -> tuple[int, dict[str, Any]] | None:
    """(status, JSON answer) of one POST; None when the peer cannot be reached."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, core.encode(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read() or b"{}")
        return resp.status, data if isinstance(data, dict) else {}
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()


def reply_of(data: Mapping[str, Any]) -> core.Reply:
    """The leader's answer as a core value (ValueError when malformed)."""
    launch = data.get("launch")
    exit_ = data.get("exit")
    return core.Reply(
        gen=int(data.get("gen", 0)),
        launch=core.Launch.from_json(launch) if isinstance(launch, dict) else None,
        ready=bool(data.get("ready")),
        exit=(int(exit_[0]), str(exit_[1])) if isinstance(exit_, list) else None,
        cause=data.get("cause") if isinstance(data.get("cause"), dict) else None,
    )
