"""The cores the guard may use: affinity capped by a cgroup v2 CPU quota."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_guard.common.shell import cores as cores_module
from sglang_guard.common.shell.cores import own_cgroup, quota_cores, usable_cores
from sglang_guard.supervise.shell.child import READ_CHUNK, WIDE_PIPE, pipe_size


@pytest.mark.parametrize(("text", "want"), [
    ("max 100000\n", None),
    ("200000 100000\n", 2),
    ("150000 100000", 2),  # 1.5 CPUs run on two cores at a time
    ("50000 100000", 1),
    ("1 100000", 1),
    ("400000 50000", 8),
    ("0 100000", None),
    ("-1 100000", None),
    ("100000 0", None),
    ("", None),
    ("max", None),
    ("lots 100000", None),
    ("100000 100000 7", None),
])
def test_a_quota_in_cores(text, want):
    assert quota_cores(text) == want


def test_the_own_cgroup_is_the_v2_line():
    text = "9:name=systemd:/\n4:memory:/x\n0::/kubepods/pod1/c1\n"
    assert own_cgroup(text) == "/kubepods/pod1/c1"
    assert own_cgroup("0::/\n") == "/"
    assert own_cgroup("4:memory:/x\n") is None
    assert own_cgroup("") is None


def _tree(tmp_path: Path, own: str, quotas: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    for where, text in quotas.items():
        (root / where).mkdir(parents=True, exist_ok=True)
        (root / where / "cpu.max").write_text(text)
    proc = tmp_path / "proc-cgroup"
    proc.write_text(f"1:cpu:/\n0::{own}\n")
    return root, proc


@pytest.fixture
def sixteen(monkeypatch):
    monkeypatch.setattr(cores_module.os, "sched_getaffinity", lambda _pid: set(range(16)))


def test_without_a_quota_the_affinity_counts(tmp_path, sixteen):
    root, proc = _tree(tmp_path, "/svc", {"": "max 100000", "svc": "max 100000"})
    assert usable_cores(root, proc) == 16


def test_the_own_quota_caps_the_affinity(tmp_path, sixteen):
    root, proc = _tree(tmp_path, "/kubepods/pod1/c1", {"kubepods/pod1/c1": "200000 100000"})
    assert usable_cores(root, proc) == 2


def test_a_quota_above_counts_too_the_least_wins(tmp_path, sixteen):
    root, proc = _tree(tmp_path, "/kubepods/pod1/c1", {
        "": "max 100000", "kubepods": "max 100000", "kubepods/pod1": "300000 100000",
        "kubepods/pod1/c1": "max 100000"})
    assert usable_cores(root, proc) == 3
    root, proc = _tree(tmp_path / "b", "/a/b", {"a": "800000 100000", "a/b": "400000 100000"})
    assert usable_cores(root, proc) == 4


def test_a_quota_above_the_affinity_leaves_it(tmp_path, monkeypatch):
    monkeypatch.setattr(cores_module.os, "sched_getaffinity", lambda _pid: {0, 1})
    root, proc = _tree(tmp_path, "/svc", {"svc": "800000 100000"})
    assert usable_cores(root, proc) == 2


def test_no_v2_cgroup_or_nothing_readable_leaves_the_affinity(tmp_path, sixteen):
    proc = tmp_path / "proc-cgroup"
    proc.write_text("4:memory:/x\n3:cpu:/\n")
    assert usable_cores(tmp_path / "none", proc) == 16
    assert usable_cores(tmp_path / "none", tmp_path / "missing") == 16
    root, proc = _tree(tmp_path / "c", "/svc", {})
    assert usable_cores(root, proc) == 16
    root, proc = _tree(tmp_path / "d", "/svc", {"svc": "garbage\x00"})
    assert usable_cores(root, proc) == 16


def test_this_process_gets_at_most_its_affinity():
    assert 1 <= usable_cores() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize(("cores", "want"), [(1, READ_CHUNK), (2, READ_CHUNK), (3, READ_CHUNK),
                                             (4, WIDE_PIPE), (16, WIDE_PIPE), (128, WIDE_PIPE)])
def test_the_pipe_is_one_read_on_few_cores_two_on_many(cores, want):
    assert pipe_size(cores) == want
    assert WIDE_PIPE == 2 * READ_CHUNK
