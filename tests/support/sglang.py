"""What some unit tests read from SGLang itself: its installed source, its release wheels.

`scripts/test unit` runs without building the SGLang environment or fetching the wheels: a
test that needs them skips and says so. A run that must not skip them (CI, and any
`scripts/test` that includes the e2e tier, which builds both) sets
SGLANG_GUARD_REQUIRE_SGLANG=1, and so does `CI` being set (as for the e2e tier,
tests/e2e/conftest.py): there a missing source or wheel fails the test.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

REQUIRE_ENV = "SGLANG_GUARD_REQUIRE_SGLANG"


def required() -> bool:
    """Whether a missing SGLang source or wheel fails the tests that read it."""
    return bool(os.environ.get("CI")) or os.environ.get(REQUIRE_ENV, "") == "1"


def missing(what: str) -> NoReturn:
    """Skip the test for lack of `what`, or fail it where SGLang is required."""
    if required():
        pytest.fail(f"{what} (${REQUIRE_ENV}=1 or $CI: this run must have it)")
    pytest.skip(what)


def sglang_src() -> Path:
    """The site-packages dir that holds SGLang 0.5.23's installed `sglang` ($SGLANG_SRC)."""
    root = Path(os.environ.get("SGLANG_SRC") or "/nonexistent")
    if not (root / "sglang" / "srt").is_dir():
        missing("the installed SGLang source is not here (set SGLANG_SRC, or run "
                "`scripts/test unit` after the SGLang environment is built)")
    return root


WHEELS_MISSING = "SGLang wheels not cached (run tools/fetch-sglang-wheels)"
