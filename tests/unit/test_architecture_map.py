"""docs/architecture.md is a true map: every module under wrapper/ is on it, and every module
it names exists."""

from __future__ import annotations

import re
from pathlib import Path

import sglang_guard

PACKAGE = Path(sglang_guard.__file__).resolve().parent
MAP = PACKAGE.parents[1] / "docs" / "architecture.md"
# A module as the map names it, by its path in the package: `cli.py`, `supervise/machine.py`,
# `supervise/shell/jobs.py` (a path from the repository's root, `tools/x.py`, is not a module of
# it).
NAMED = re.compile(r"`((?!(?:wrapper|tests|tools|bench|scripts|docs|configs|deploy)/)"
                   r"(?:[a-z_][a-z0-9_]*/)*[a-z_][a-z0-9_]*\.py)`")


def modules() -> set[str]:
    """Every module of the package, relative to it (`supervise/machine.py`)."""
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
            if "__pycache__" not in p.parts}


def on_the_map() -> set[str]:
    """Every module path the map names."""
    return set(NAMED.findall(MAP.read_text(encoding="utf-8")))


def test_the_package_is_read_whole() -> None:
    found = modules()
    assert {"cli.py", "supervise/machine.py", "supervise/shell/supervisor.py"} <= found
    assert all(not m.startswith(("tests/", "tools/")) for m in found)


def test_every_module_under_wrapper_is_on_the_map() -> None:
    missing = sorted(modules() - on_the_map())
    assert not missing, f"docs/architecture.md does not show: {missing}"


def test_every_module_the_map_names_exists() -> None:
    stale = sorted(on_the_map() - modules())
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"
