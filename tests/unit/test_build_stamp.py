"""The wheel's build stamp (hatch_build.write_stamp): which commit a wheel was built from.

The bench names the guard an installed wheel runs by it (bench/compare/main.guard_build),
where no .git came with the copy (the device hosts). hatchling is the build's own
dependency, not the test environment's: its hook interface is stood in for here, and the
stamp is written for a real git repository."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    for name in ("hatchling", "hatchling.builders", "hatchling.builders.hooks",
                 "hatchling.builders.hooks.plugin"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    interface = types.ModuleType("hatchling.builders.hooks.plugin.interface")
    interface.BuildHookInterface = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, interface.__name__, interface)
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.delitem(sys.modules, "hatch_build", raising=False)
    return importlib.import_module("hatch_build")


def git(root: Path, *args: str) -> str:
    program = shutil.which("git")
    assert program is not None
    return subprocess.run([program, "-C", str(root), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_stamp_names_the_commit_and_says_when_tracked_files_differ(hook, tmp_path):
    (tmp_path / "wrapper" / "sglang_guard").mkdir(parents=True)
    (tmp_path / "a.txt").write_text("one\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git(tmp_path, "rev-parse", "--short", "HEAD")

    written = hook.write_stamp(tmp_path)
    assert written == tmp_path / "wrapper" / "sglang_guard" / "_build.txt"
    assert written.read_text() == f"{head}\n"  # an untracked file (the stamp) is no change

    (tmp_path / "a.txt").write_text("two\n")
    assert hook.write_stamp(tmp_path).read_text() == f"{head}+dirty\n"


def test_without_a_repository_the_stamp_says_unknown(hook, tmp_path, monkeypatch):
    (tmp_path / "wrapper" / "sglang_guard").mkdir(parents=True)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert hook.write_stamp(tmp_path).read_text() == "unknown\n"
