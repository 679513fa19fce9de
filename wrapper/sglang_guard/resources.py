"""Where the guard's data tables (`configs/`) live, installed or in a source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def configs_dir() -> Path:
    """The directory holding the shipped tables and rule packs."""
    bundled = _PACKAGE / "_configs"  # a wheel install (see pyproject force-include)
    if bundled.is_dir():
        return bundled
    return _PACKAGE.parent.parent / "configs"  # an editable install or the source tree


def config_path(*parts: str) -> Path:
    """A path inside `configs/`."""
    return configs_dir().joinpath(*parts)
