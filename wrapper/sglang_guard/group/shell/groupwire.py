"""The group's wire: one JSON POST between guards (a link is a loop `Listener`, see
supervise/shell/observer.py)."""

from __future__ import annotations

import http.client
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from sglang_guard.common.outcomes import GiveUpCause
from sglang_guard.group import group as core
from sglang_guard.group import groupauth as auth

Clock = Callable[[], float]


# -- HTTP -----------------------------------------------------------------------------------

UNPROVEN = -1  # the status `post` gives an answer that does not prove the group's secret


def post(host: str, port: int, path: str, body: Mapping[str, Any], *, timeout: float,
         secret: bytes | None = None) -> tuple[int, dict[str, Any]] | None:
    """(status, JSON answer) of one POST; None when the peer cannot be reached.

    With `secret` the request is signed and the answer must be signed for this request
    (else `(UNPROVEN, {"reason": why})`: not the leader, whatever it says).
    """
    payload = core.encode(body)
    nonce = secrets.token_hex(16)
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers.update(auth.request_headers(secret, path, payload, time.time(), nonce))
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, payload, headers)
        resp = conn.getresponse()
        raw = resp.read(auth.MAX_BODY + 1)
        if secret is not None:
            why = auth.check_reply(secret, resp.headers, path, nonce, status=resp.status,
                                   body=raw, now=time.time())
            if why is not None:
                return UNPROVEN, {"reason": why, "status": resp.status}
        if len(raw) > auth.MAX_BODY:
            return None
        return resp.status, auth.strict_json(raw)
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
        # the leader's give-up cause (a leader before it was sent: other)
        exit_cause=GiveUpCause.of(exit_[2]) if isinstance(exit_, list) and len(exit_) > 2
        else GiveUpCause.OTHER,
    )
