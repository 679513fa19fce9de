"""Fixtures of the group tier; the group harness (Group, Node, the plans) is support/group.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.group import Group
from support.harness import HealthServer


@pytest.fixture(autouse=True)
def _threads_end(no_leaked_threads: None) -> None:
    """Every test here fails when it leaves a thread running."""


@pytest.fixture
def health() -> Iterator[HealthServer]:
    """Rank 0's SGLang /health, as the leader guard probes it."""
    with HealthServer() as server:
        yield server


@pytest.fixture
def group(tmp_path: Path, health: HealthServer) -> Iterator[Any]:
    """A factory of groups; every process left is killed at the end."""
    made: list[Group] = []

    def make(nnodes: int) -> Group:
        g = Group(tmp_path, nnodes, health)
        made.append(g)
        return g

    yield make
    for g in made:
        g.stop_all()

