"""Restart delays: a small pure function, jitter passed in (stamina's `_compute_backoff` shape)."""

from __future__ import annotations


def backoff_delay(
    attempt: int, *, initial: float, factor: float, maximum: float, jitter: float
) -> float:
    """Seconds to wait before restart number `attempt` (0-based); `jitter` in [0, 1).

    Exponential, clamped to `maximum`, then stretched by up to 25% so that a fleet of
    guards that failed together does not restart in lock-step.
    """
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1), got {jitter}")
    try:
        grown = initial * factor ** max(0, attempt)
    except OverflowError:  # a long crash history: float power overflows long before `maximum`
        grown = maximum
    base = min(maximum, grown)
    return base * (1.0 + 0.25 * jitter)


def failures_in_window(stamps: tuple[float, ...], now: float, window: float) -> tuple[float, ...]:
    """The failure times that still count: those within `window` seconds of `now`."""
    return tuple(t for t in stamps if now - t <= window)
