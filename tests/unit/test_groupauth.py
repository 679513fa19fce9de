"""group/groupauth.py: the MACs, the replay window, the body limits, strict JSON."""

from __future__ import annotations

import json
import random

import pytest

from sglang_guard.group import groupauth as auth

SECRET = b"s" * 32
PATH = "/group/beat"


def signed(body: bytes, now: float = 1000.0, nonce: str = "n1", secret: bytes = SECRET
           ) -> dict[str, str]:
    return auth.request_headers(secret, PATH, body, now, nonce)


def check(headers: dict[str, str], body: bytes, now: float = 1000.0,
          nonces: auth.Nonces | None = None) -> tuple[int, str] | None:
    return auth.check_request(SECRET, headers, PATH, body=body, now=now,
                              nonces=nonces or auth.Nonces())


def test_a_signed_request_passes_once() -> None:
    nonces = auth.Nonces()
    h = signed(b"{}")
    assert check(h, b"{}", nonces=nonces) is None
    status, why = check(h, b"{}", nonces=nonces) or (0, "")
    assert status == 403 and "replayed" in why


@pytest.mark.parametrize("change", ["body", "path", "secret", "time", "nonce", "none"])
def test_anything_changed_is_401(change: str) -> None:
    h = signed(b'{"rank": 1}')
    body = b'{"rank": 2}' if change == "body" else b'{"rank": 1}'
    if change == "path":
        h = auth.request_headers(SECRET, "/group/join", body, 1000.0, "n1")
    elif change == "secret":
        h = signed(body, secret=b"t" * 32)
    elif change == "time":
        h = {**h, auth.H_TIME: "1001.000"}
    elif change == "nonce":
        h = {**h, auth.H_NONCE: "n2"}
    elif change == "none":
        h = {}
    result = check(h, body)
    assert result is not None and result[0] == 401


@pytest.mark.parametrize("skew", [-61.0, 61.0, float("inf")])
def test_stale_or_future_is_403(skew: float) -> None:
    h = signed(b"{}", now=1000.0 + skew) if skew != float("inf") else {
        **signed(b"{}"), auth.H_TIME: "inf"}
    if skew == float("inf"):
        h[auth.H_MAC] = auth.request_mac(SECRET, PATH, "inf", "n1", b"{}")
    result = check(h, b"{}")
    assert result is not None and result[0] == 403


def test_nonces_expire_after_the_window_and_are_bounded() -> None:
    nonces = auth.Nonces(kept=3)
    assert nonces.first_time("a", 0.0)
    assert not nonces.first_time("a", 30.0)
    assert nonces.first_time("a", 61.0)  # out of the window: stale requests are 403 anyway
    for i in range(10):
        nonces.first_time(str(i), 62.0)
    assert len(nonces._seen) <= 3


def test_an_answer_binds_to_its_request() -> None:
    h = auth.reply_headers(SECRET, PATH, "n1", status=200, body=b"{}", now=1000.0)
    assert auth.check_reply(SECRET, h, PATH, "n1", status=200, body=b"{}", now=1000.0) is None
    for nonce, status, body in (("n2", 200, b"{}"), ("n1", 409, b"{}"), ("n1", 200, b"[]")):
        assert auth.check_reply(SECRET, h, PATH, nonce, status=status, body=body,
                                now=1000.0) is not None
    assert auth.check_reply(SECRET, {}, PATH, "n1", status=200, body=b"{}", now=1000.0)


@pytest.mark.parametrize(("text", "error"), [
    (None, ValueError), ("", ValueError), ("-1", ValueError), ("1e3", ValueError),
    ("١٢", ValueError), (str(256 << 20), OverflowError), ("9" * 40, OverflowError),
    (str(auth.MAX_BODY + 1), OverflowError)])
def test_content_length_refused_at_the_header(text: str | None, error: type) -> None:
    with pytest.raises(error):
        auth.content_length(text)


def test_content_length_within_the_limit() -> None:
    assert auth.content_length(" 12 ") == 12
    assert auth.content_length(str(auth.MAX_BODY)) == auth.MAX_BODY


@pytest.mark.parametrize("body", [
    b'{"rank": 1e400}', b'{"rank": -1e400}', b'{"x": NaN}', b'{"x": Infinity}', b"[1]",
    b'"x"', b"\xff", b"[" * 100_000, b'{"a":' * 20 + b"1" + b"}" * 20, b"{", b"null"])
def test_strict_json_refuses(body: bytes) -> None:
    with pytest.raises(ValueError):
        auth.strict_json(body)


def _random_value(rng: random.Random, depth: int) -> object:
    kind = rng.randrange(7 if depth < 24 else 4)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randrange(-(1 << 60), 1 << 60)
    if kind == 2:
        return rng.uniform(-1e300, 1e300)
    if kind == 3:
        return "".join(rng.choice('ab"\\\u00e9[]{}') for _ in range(rng.randrange(5)))
    if kind in (4, 5):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {str(i): _random_value(rng, depth + 1) for i in range(rng.randrange(3))}


def test_strict_json_takes_any_finite_object_up_to_the_depth_limit() -> None:
    rng = random.Random(22)  # noqa: S311 - test data, not a secret
    seen = {True: 0, False: 0}
    for _ in range(3000):
        value = _random_value(rng, 1)
        for _ in range(rng.randrange(24)):  # a chain of containers around it
            value = [value] if rng.random() < 0.5 else {"k": value}
        data = {"v": value}
        text = json.dumps(data).encode()
        fits = _depth(data) <= auth.MAX_DEPTH
        seen[fits] += 1
        if fits:
            assert auth.strict_json(text) == data
        else:
            with pytest.raises(ValueError):
                auth.strict_json(text)
    assert seen[True] > 100 and seen[False] > 100  # both sides of the limit were tried


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@pytest.mark.parametrize("value", [True, 1.0, "1", None, 1 << 60])
def test_whole_refuses_what_is_not_a_whole_number(value: object) -> None:
    with pytest.raises(ValueError):
        auth.whole(value, "rank")


def test_short_secrets_are_refused() -> None:
    assert auth.check_secret(b"x" * 15) is not None
    assert auth.check_secret(b"x" * 16) is None
