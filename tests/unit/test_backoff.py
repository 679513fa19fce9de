"""Restart delays and the crash-loop window: pure functions, table-driven."""

from __future__ import annotations

import pytest

from sglang_guard.supervise.backoff import backoff_delay, failures_in_window

KW = {"initial": 1.0, "factor": 2.0, "maximum": 60.0}


@pytest.mark.parametrize(
    ("attempt", "jitter", "expected"),
    [
        (0, 0.0, 1.0),
        (1, 0.0, 2.0),
        (5, 0.0, 32.0),
        (6, 0.0, 60.0),  # clamped
        (100, 0.0, 60.0),  # no overflow, still clamped
        (-3, 0.0, 1.0),  # a negative attempt counts as the first
        (0, 0.5, 1.125),
        (6, 0.999, 60.0 * (1 + 0.25 * 0.999)),  # jitter stretches past the clamp, by <= 25%
    ],
)
def test_backoff_delay(attempt: int, jitter: float, expected: float) -> None:
    assert backoff_delay(attempt, jitter=jitter, **KW) == pytest.approx(expected)


def test_backoff_is_monotonic_without_jitter() -> None:
    delays = [backoff_delay(n, jitter=0.0, **KW) for n in range(12)]
    assert delays == sorted(delays)
    assert max(delays) == 60.0


def test_huge_attempt_with_float_factor_does_not_raise() -> None:
    assert backoff_delay(10_000, jitter=0.0, initial=1.0, factor=1.5, maximum=5.0) == 5.0


@pytest.mark.parametrize("jitter", [-0.1, 1.0, 2.0, float("nan")])
def test_jitter_out_of_range(jitter: float) -> None:
    with pytest.raises(ValueError, match="jitter"):
        backoff_delay(0, jitter=jitter, **KW)


@pytest.mark.parametrize(
    ("stamps", "now", "window", "kept"),
    [
        ((), 10.0, 5.0, ()),
        ((1.0, 5.0, 9.0), 10.0, 5.0, (5.0, 9.0)),  # the edge counts
        ((1.0, 2.0), 100.0, 5.0, ()),
        ((1.0, 2.0), 2.0, 0.0, (2.0,)),
    ],
)
def test_failures_in_window(stamps: tuple[float, ...], now: float, window: float,
                            kept: tuple[float, ...]) -> None:
    assert failures_in_window(stamps, now, window) == kept
