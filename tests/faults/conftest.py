"""Fault injection against `sglang-guard run` as a process, with the fake child as SGLang.

Helpers and fixtures come from tests/support (Launcher, HealthServer, guard_toml, GuardRun,
wait_for, the journal readers). Long variants are marked `soak`: they are deselected unless
asked for (`python -m pytest tests/faults -m soak`).
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Register the `soak` marker."""
    config.addinivalue_line("markers", "soak: long fault runs (1 GB, 1000 cycles); not in CI")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip soak tests unless a -m expression was given (CI runs the short variants)."""
    if config.option.markexpr:
        return
    skip = pytest.mark.skip(reason="soak test: run with `python -m pytest tests/faults -m soak`")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _threads_end(no_leaked_threads: None) -> None:
    """Every test here fails when it leaves a thread running."""
