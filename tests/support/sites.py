"""A fake SGLang installation on disk (tests/data/fake-sglang), as the release reader sees one."""

from __future__ import annotations

import shutil
from pathlib import Path

FAKE = Path(__file__).resolve().parent.parent / "data" / "fake-sglang"


def site_with(tmp_path: Path, version: str | None, *, package: bool = True,
              version_py: str | None = None) -> Path:
    site = tmp_path / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    if package:
        shutil.copytree(FAKE / "sglang", site / "sglang", dirs_exist_ok=True)
    if version_py is not None:
        (site / "sglang" / "version.py").write_text(f'__version__ = "{version_py}"\n')
    if version is not None:
        dist = site / f"sglang-{version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n\nVersion: not-this\n")
        (dist / "RECORD").write_text("sglang/__init__.py,sha256=abc,10\n")
    return site

