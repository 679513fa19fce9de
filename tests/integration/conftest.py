"""The integration tier starts real processes and threads: none may outlive its test.

The harness and fixtures are tests/support's.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _threads_end(no_leaked_threads: None) -> None:
    """Every test here fails when it leaves a thread running."""
