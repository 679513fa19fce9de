"""Serialized Hyperscan databases: a hit loads, a miss or an unusable file compiles, and the
answers are the same either way."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_guard.rules import blockscan
from sglang_guard.rules.blockscan import BlockScan
from sglang_guard.rules.shell.scancache import MAGIC, FileStore

pytestmark = pytest.mark.skipif(blockscan._hs is None, reason="no hyperscan wheel here")

PATTERNS = (r"CUDA out of memory", r"(?i)address already in use", r"^Traceback \(most recent",
            r"KV cache pool is full\. Retract requests", r"Scheduler hit an exception")
BLOCKS = (b"", b"nothing here\n", b"x torch.OutOfMemoryError: CUDA out of memory. Tried\n",
          b"ERROR: [Errno 98] ADDRESS ALREADY IN USE\n" * 3,
          b"ok\nTraceback (most recent call last):\n  File x\n",
          b"Scheduler hit an exception: boom\nKV cache pool is full. Retract requests.\n")


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many Hyperscan compiles happen (the store is reset around each test)."""
    counted: list[int] = []
    real = blockscan._compile_hs

    def counting(*args: object) -> object:
        counted.append(1)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(blockscan, "_compile_hs", counting)
    yield counted
    blockscan.use_store(None)


def _answers(store: FileStore | None) -> list[list[int]]:
    blockscan.use_store(store)  # also forgets the in-process compiled sets
    scan = BlockScan(PATTERNS)
    assert scan.engine == "hyperscan"
    return [sorted(scan.hits(b)) for b in BLOCKS]


def _files(d: Path) -> list[Path]:
    return sorted(d.glob("*.hsdb"))


def test_miss_compiles_and_saves_then_a_hit_loads(tmp_path: Path, compiles: list[int]) -> None:
    expected = _answers(None)
    assert len(compiles) == 1
    store = FileStore(tmp_path / "hs")
    assert _answers(store) == expected
    assert len(compiles) == 2  # a miss
    [saved] = _files(tmp_path / "hs")
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "hs").stat().st_mode) == 0o700
    assert _answers(FileStore(tmp_path / "hs")) == expected
    assert len(compiles) == 2  # a hit: loaded, not compiled


def test_other_patterns_are_another_key(tmp_path: Path, compiles: list[int]) -> None:
    store = FileStore(tmp_path / "hs")
    _answers(store)
    blockscan.use_store(store)
    BlockScan(PATTERNS[:-1]).compile()
    assert len(_files(tmp_path / "hs")) == 2
    assert len(compiles) == 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "wrong-magic", "valid-digest-not-a-db"])
def test_a_corrupt_file_falls_back_to_compiling(tmp_path: Path, compiles: list[int],
                                                damage: str) -> None:
    expected = _answers(None)
    _answers(FileStore(tmp_path / "hs"))
    [saved] = _files(tmp_path / "hs")
    data = bytearray(saved.read_bytes())
    if damage == "flip":
        data[-100] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "wrong-magic":
        data[:4] = b"XXXX"
    else:  # our framing is intact, the payload is not a Hyperscan database
        from sglang_guard.common.sha import sha256  # noqa: PLC0415

        junk = os.urandom(4096)
        data = bytearray(MAGIC + sha256(junk).digest() + junk)
    saved.write_bytes(bytes(data))
    before = len(compiles)
    assert _answers(FileStore(tmp_path / "hs")) == expected
    assert len(compiles) == before + 1
    # ... and the file was replaced by a good one: the next start loads it
    assert _answers(FileStore(tmp_path / "hs")) == expected
    assert len(compiles) == before + 1


def test_a_directory_others_can_write_is_not_used(tmp_path: Path, compiles: list[int]) -> None:
    shared = tmp_path / "hs"
    shared.mkdir(mode=0o700)
    shared.chmod(0o777)
    store = FileStore(shared)
    expected = _answers(None)
    assert _answers(store) == expected
    assert _answers(store) == expected
    assert _files(shared) == []
    assert store.usable is False
    assert store.why is not None
    assert "writable" in store.why


def test_a_symlinked_or_group_writable_file_is_ignored(tmp_path: Path, compiles: list[int]
                                                       ) -> None:
    _answers(FileStore(tmp_path / "hs"))
    [saved] = _files(tmp_path / "hs")
    elsewhere = tmp_path / "elsewhere.hsdb"
    saved.rename(elsewhere)
    saved.symlink_to(elsewhere)
    before = len(compiles)
    _answers(FileStore(tmp_path / "hs"))
    assert len(compiles) == before + 1
    [saved] = _files(tmp_path / "hs")
    assert not saved.is_symlink()  # replaced, not written through
    saved.chmod(0o620)
    _answers(FileStore(tmp_path / "hs"))
    assert len(compiles) == before + 2


def test_an_unwritable_cache_only_costs_a_compile(tmp_path: Path, compiles: list[int]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = FileStore(blocker / "hs")
    assert _answers(store) == _answers(None)
    assert store.usable is False


def test_keys_that_are_not_digests_are_refused(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "hs")
    store.save("../escape", b"x")
    assert store.load("../escape") is None
    assert not (tmp_path / "escape.hsdb").exists()


def test_a_miss_is_built_in_a_child_process_and_loaded(tmp_path: Path, compiles: list[int]
                                                      ) -> None:
    from sglang_guard.rules.shell.scancache import build_elsewhere  # noqa: PLC0415

    expected = _answers(None)
    before = len(compiles)
    store = FileStore(tmp_path / "hs")
    blockscan.use_store(store, build=build_elsewhere(store))
    scan = BlockScan(PATTERNS)
    assert [sorted(scan.hits(b)) for b in BLOCKS] == expected
    assert len(compiles) == before  # compiled by the child process, not here
    assert len(_files(tmp_path / "hs")) == 1


def test_a_builder_that_builds_nothing_means_a_compile_here(tmp_path: Path,
                                                            compiles: list[int]) -> None:
    asked: list[tuple[str, ...]] = []
    expected = _answers(None)
    before = len(compiles)
    blockscan.use_store(FileStore(tmp_path / "hs"), build=lambda p, lines: asked.append(p))
    assert [sorted(BlockScan(PATTERNS).hits(b)) for b in BLOCKS] == expected
    assert asked == [PATTERNS]
    assert len(compiles) == before + 1
