"""Readers over an SGLang release's source: a wheel (zip) or an installed site-packages."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

Reader = Callable[[str], str | None]


def wheel_reader(path: Path) -> Reader:
    """Read `sglang/...` files out of a wheel without unpacking it."""
    archive = zipfile.ZipFile(path)
    names = set(archive.namelist())

    def read(name: str) -> str | None:
        if name not in names:
            return None
        return archive.read(name).decode("utf-8")

    return read


def dir_reader(root: Path) -> Reader:
    """Read `sglang/...` files under a site-packages directory."""

    def read(name: str) -> str | None:
        path = root / name
        try:
            return path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None

    return read
