"""The hyperscan the guard allows is one whose scan it can use (bench/hyperscan-builds-latest.txt):
it takes the buffers the frames' search passes, at the speed the pipe needs."""

from __future__ import annotations

import tomllib
from pathlib import Path

import hyperscan
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _allowed() -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [req] = [Requirement(d) for d in deps if Requirement(d).name == "hyperscan"]
    return req


@pytest.mark.parametrize(("version", "why"), [
    ("0.7.21", "scans only bytes: the frames' search passes a memoryview"),
    ("0.7.23", "scans at ~35 MB/s"),
    ("0.7.30", "scans at ~35 MB/s"),
    ("0.8.0", "scans at ~35 MB/s"),
])
def test_builds_measured_unusable_are_refused(version, why):
    assert not _allowed().specifier.contains(Version(version)), why


@pytest.mark.parametrize("version", ["0.8.1", "0.8.2", "0.9.0", "0.9.1"])
def test_builds_measured_fine_are_allowed(version):
    assert _allowed().specifier.contains(Version(version))


def test_the_installed_build_scans_what_the_frames_search_passes():
    db = hyperscan.Database()
    db.compile(expressions=[b"ab"], ids=[0], flags=[0])
    found: list[int] = []

    def on_match(_id: int, _start: int, end: int, _flags: int, _ctx: object) -> bool:
        found.append(end)
        return False

    for block in (b"xxab", bytearray(b"xxab"), memoryview(b"zxxab")[1:]):
        db.scan(block, match_event_handler=on_match)
    assert found == [4, 4, 4]
