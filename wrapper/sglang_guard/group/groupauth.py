"""How the guards of one group prove each other, decided without I/O.

Every request carries an HMAC-SHA256, keyed with the group's shared secret (`[group]
secret_file`), over its path, a timestamp, a nonce and its body; the leader refuses one
without it or with a wrong one (401), and one too old, too far ahead or seen before (403).
Every answer carries an HMAC over the request's nonce, the status and the body, so a worker
follows only a leader that holds the same secret, and only the answer to its own request.
HMAC proves who sent a message, it does not hide it: secrets never travel in one
(group/group.py masks them).

The body a guard reads is bounded at the header (`content_length`) and parsed strictly
(`strict_json`): finite numbers, a nesting depth limit, an object at the top.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections import OrderedDict
from typing import Any, Protocol

H_TIME = "X-Guard-Time"
H_NONCE = "X-Guard-Nonce"
H_MAC = "X-Guard-Mac"
WINDOW_S = 60.0  # a request older (or further ahead) than this is stale: clocks of one group
MAX_BODY = 1 << 20  # 1 MiB: a beat with its reports is a few KiB
MAX_DEPTH = 16  # the deepest a message nests (a launch's YAML included)
MIN_SECRET = 16  # bytes: a shorter shared secret is refused
NONCES_KEPT = 65536  # the most nonces the leader remembers (they expire after WINDOW_S)



class Headers(Protocol):
    """A message's headers (http.client's and http.server's both)."""

    def get(self, name: str, /) -> str | None:
        """The value of header `name` (None: absent)."""


UNAUTHENTICATED = 401
FORBIDDEN = 403


def hmac_hex(secret: bytes, message: bytes) -> str:
    """HMAC-SHA256 of `message` under `secret`, as hex."""
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _mac(secret: bytes, *parts: bytes) -> str:
    return hmac_hex(secret, b"\n".join(parts))


def request_mac(secret: bytes, path: str, stamp: str, nonce: str, body: bytes) -> str:
    """The MAC a request carries."""
    return _mac(secret, b"request", path.encode(), stamp.encode(), nonce.encode(), body)


def reply_mac(secret: bytes, path: str, nonce: str, stamp: str, *, status: int,
              body: bytes) -> str:
    """The MAC an answer carries: bound to the request's nonce, so it answers that one only."""
    return _mac(secret, b"reply", path.encode(), nonce.encode(), stamp.encode(),
                str(status).encode(), body)


def request_headers(secret: bytes, path: str, body: bytes, now: float, nonce: str
                    ) -> dict[str, str]:
    """The headers that authenticate a request made at wall-clock `now`."""
    stamp = f"{now:.3f}"
    return {H_TIME: stamp, H_NONCE: nonce, H_MAC: request_mac(secret, path, stamp, nonce, body)}


def reply_headers(secret: bytes, path: str, nonce: str, *, status: int, body: bytes,
                  now: float) -> dict[str, str]:
    """The headers that authenticate an answer to the request that carried `nonce`."""
    stamp = f"{now:.3f}"
    return {H_TIME: stamp, H_MAC: reply_mac(secret, path, nonce, stamp, status=status, body=body)}


def _fresh(stamp: str | None, now: float) -> bool:
    try:
        t = float(stamp or "")
    except ValueError:
        return False
    return math.isfinite(t) and abs(now - t) <= WINDOW_S


class Nonces:
    """The nonces of the last WINDOW_S: a request seen before is a replay."""

    def __init__(self, kept: int = NONCES_KEPT) -> None:
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._kept = kept

    def first_time(self, nonce: str, now: float) -> bool:
        """Record `nonce`; False when it was seen within the window."""
        while self._seen:
            oldest, at = next(iter(self._seen.items()))
            if now - at <= WINDOW_S and len(self._seen) < self._kept:
                break
            del self._seen[oldest]
        if nonce in self._seen:
            return False
        self._seen[nonce] = now
        return True


def check_request(secret: bytes, headers: Headers, path: str, *,
                  body: bytes, now: float, nonces: Nonces) -> tuple[int, str] | None:
    """Why this request is refused, as (status, reason); None: it proves the secret."""
    stamp, nonce, mac = (headers.get(h) for h in (H_TIME, H_NONCE, H_MAC))
    if not stamp or not nonce or not mac:
        return UNAUTHENTICATED, "no group authentication (the group's secret_file)"
    if len(nonce) > 64 or not hmac.compare_digest(
            mac.encode(), request_mac(secret, path, stamp, nonce, body).encode()):
        return UNAUTHENTICATED, "the request does not prove the group's secret"
    if not _fresh(stamp, now):
        return FORBIDDEN, f"stale request (more than {WINDOW_S:g}s off this guard's clock)"
    if not nonces.first_time(nonce, now):
        return FORBIDDEN, "replayed request (its nonce was seen before)"
    return None


def check_reply(secret: bytes, headers: Headers, path: str, nonce: str, *,
                status: int, body: bytes, now: float) -> str | None:
    """Why this answer is not the leader's (None: it proves the secret and answers us)."""
    stamp, mac = headers.get(H_TIME), headers.get(H_MAC)
    if not stamp or not mac:
        return "the answer carries no group authentication"
    expected = reply_mac(secret, path, nonce, stamp, status=status, body=body)
    if not hmac.compare_digest(mac.encode(), expected.encode()):
        return "the answer does not prove the group's secret"
    if not _fresh(stamp, now):
        return f"the answer is stale (more than {WINDOW_S:g}s off this guard's clock)"
    return None


def check_secret(secret: bytes) -> str | None:
    """What is wrong with a shared secret as read from its file (None: usable)."""
    if len(secret) < MIN_SECRET:
        return f"holds {len(secret)} bytes; a group secret needs at least {MIN_SECRET}"
    return None


# -- the body ---------------------------------------------------------------------------------


def content_length(text: str | None, limit: int = MAX_BODY) -> int:
    """The body size a request announces; ValueError when absent, malformed or over `limit`."""
    t = (text or "").strip()
    if not (t.isascii() and t.isdigit()):
        raise ValueError(f"Content-Length {t[:20]!r}: expected a size in bytes")
    if len(t) > 12 or int(t) > limit:
        raise OverflowError(f"Content-Length {t[:20]}: over the {limit} byte limit")
    return int(t)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is not a finite number")
    return value


def _depth(value: Any, limit: int) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            raise ValueError(f"nested deeper than {limit}")
        stack.extend((child, depth + 1) for child in children)


def strict_json(data: bytes, depth: int = MAX_DEPTH) -> dict[str, Any]:
    """A message body: one JSON object, finite numbers only, nested at most `depth` deep."""
    try:
        value = json.loads(data or b"{}", parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError(f"nested deeper than {depth}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc.reason}") from None
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    _depth(value, depth)
    return value


def whole(value: object, what: str) -> int:
    """A whole number a peer sent (not a bool, a float or a string); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what}: expected a whole number, got {type(value).__name__}")
    if abs(value) > 1 << 53:
        raise ValueError(f"{what}: out of range")
    return value
