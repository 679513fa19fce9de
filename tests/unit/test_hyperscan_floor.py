"""The hyperscan builds the guard allows are those measured to scan at the speed the pipe needs
(bench/hyperscan-builds-latest.txt), and the frames' search works on each (a memoryview where
the build takes one, bytes where it does not)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import hyperscan
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from sglang_guard.rules import blockscan
from sglang_guard.rules.tracebacks import _FRAMES_FAST

ROOT = Path(__file__).resolve().parents[2]


def _allowed() -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [req] = [Requirement(d) for d in deps if Requirement(d).name == "hyperscan"]
    return req


@pytest.mark.parametrize(("version", "why"), [
    ("0.7.7", "older than the measured 0.7.21 (a scan leak upstream)"),
    ("0.7.23", "scans at ~35 MB/s"),
    ("0.7.30", "scans at ~35 MB/s"),
    ("0.8.0", "scans at ~35 MB/s"),
])
def test_builds_measured_unusable_are_refused(version, why):
    assert not _allowed().specifier.contains(Version(version)), why


def test_the_build_under_test_is_the_one_asked_for():
    # scripts/test runs these tests again on the other allowed line (PYTHONPATH): that one.
    want = os.environ.get("SGLANG_GUARD_EXPECT_HYPERSCAN")
    if want is None:
        pytest.skip("no particular hyperscan asked for (scripts/test's second run sets one)")
    assert hyperscan.__version__ == want


@pytest.mark.parametrize("version", ["0.7.21", "0.8.1", "0.8.2", "0.9.0", "0.9.1"])
def test_builds_measured_fine_are_allowed(version):
    assert _allowed().specifier.contains(Version(version))


def test_the_frames_search_answers_alike_on_views_and_on_bytes(monkeypatch):
    # The installed build's answer, and bytes forced: the same line either way.
    block = b"  File \"x.py\", line 1\n    raise X\nValueError: boom\n[2026-01-01 00:00:00] ok\n"
    if not _FRAMES_FAST.compile():
        pytest.skip("Hyperscan does not take the frames' patterns here")
    want = _FRAMES_FAST.start(block, 0, len(block))
    assert want == block.index(b"ValueError")
    takes = blockscan._VIEWS[0]  # asked by the first search
    for views in {takes, False}:  # bytes work on every build; a view where it takes one
        monkeypatch.setattr(blockscan, "_VIEWS", [views])
        assert _FRAMES_FAST.start(block, 0, len(block)) == want
        assert _FRAMES_FAST.start(block, want, len(block)) == want


def test_the_installed_build_is_asked_what_it_scans(monkeypatch):
    db = hyperscan.Database()
    db.compile(expressions=[b"ab"], ids=[0], flags=[0])
    takes = True
    try:
        db.scan(memoryview(b"xxab"), match_event_handler=lambda *_: False)
    except TypeError:
        takes = False
    monkeypatch.setattr(blockscan, "_VIEWS", [])
    assert blockscan._takes_views(db, hyperscan.Scratch(db)) is takes
