"""Reading an interpreter's SGLang release from disk, and tables for an unshipped release."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sglang_guard.errors import InputError
from sglang_guard.sglang import sgl_options
from sglang_guard.sglang.shell.release import (
    ReleaseFact,
    derive_release,
    find_release,
    interpreter_path,
    tables_for,
)
from support.sites import site_with

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "data" / "fake-sglang"


def test_version_from_dist_info(tmp_path: Path) -> None:
    site = site_with(tmp_path, "0.5.24")
    fact = find_release(["/nonexistent", str(site)])
    assert fact is not None
    assert fact.version == "0.5.24"
    assert fact.source == f"dist-info:{site / 'sglang-0.5.24.dist-info' / 'METADATA'}"
    assert (fact.site, fact.record) == (site, site / "sglang-0.5.24.dist-info" / "RECORD")


def test_the_first_sglang_on_the_path_wins(tmp_path: Path) -> None:
    first = site_with(tmp_path / "a", "0.5.18")
    second = site_with(tmp_path / "b", "0.5.23")
    fact = find_release([str(first), str(second)])
    assert fact is not None
    assert fact.version == "0.5.18"


def test_a_dist_info_without_the_package_is_not_what_imports(tmp_path: Path) -> None:
    stale = site_with(tmp_path / "a", "0.5.10", package=False)
    real = site_with(tmp_path / "b", "0.5.23")
    fact = find_release([str(stale), str(real)])
    assert fact is not None
    assert fact.version == "0.5.23"


def test_source_checkout_version_py(tmp_path: Path) -> None:
    site = site_with(tmp_path, None, version_py="0.5.25.dev0")
    fact = find_release([str(site)])
    assert fact is not None
    assert (fact.version, fact.record) == ("0.5.25.dev0", None)
    assert fact.source.startswith("version.py:")


def test_empty_string_entry_is_the_working_directory(tmp_path: Path) -> None:
    site = site_with(tmp_path, "0.5.22")
    fact = find_release([""], cwd=site)
    assert fact is not None
    assert fact.version == "0.5.22"


def test_no_sglang_anywhere(tmp_path: Path) -> None:
    assert find_release([str(tmp_path)]) is None


def test_interpreter_path_is_read_without_importing_sglang() -> None:
    path = interpreter_path(sys.executable)
    assert any(p.endswith("site-packages") for p in path)
    assert "sglang" not in sys.modules


def test_a_missing_interpreter_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot ask"):
        interpreter_path(str(tmp_path / "no-python"))


def test_unknown_release_tables_are_derived_and_cached(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    site = site_with(tmp_path, "0.5.24")
    fact = find_release([str(site)])
    assert fact is not None
    cache = tmp_path / "cache"
    tables = derive_release(fact, cache)
    assert (tables.release, tables.origin, tables.exact) == ("0.5.24", "derived", True)
    assert "--tensor-parallel-size" in tables.options.by_string
    assert tables.choices["attention_backend"] == ("triton", "fa3", "flashinfer")
    assert tables.arch.mla == ("DeepseekV3ForCausalLM",)
    assert len(list((cache / "sglang-tables").glob("*.json"))) == 1

    def boom(*_: object) -> None:
        raise AssertionError("the cached table must be used")

    # The reader is imported when a table is derived (sglang/shell/release.py keeps `check` light).
    monkeypatch.setattr(sgl_options, "release_table", boom)
    assert derive_release(fact, cache).options == tables.options
    # A different RECORD (a reinstall) is a different cache entry: read again.
    assert fact.record is not None
    fact.record.write_text("sglang/__init__.py,sha256=def,10\n")
    with pytest.raises(AssertionError, match="cached table"):
        derive_release(fact, cache)


def test_tables_for_a_shipped_release_do_not_read_the_source(tmp_path: Path) -> None:
    fact = ReleaseFact("0.5.18", "cli", None, None)
    tables = tables_for(fact, tmp_path)
    assert (tables.release, tables.origin) == ("0.5.18", "shipped")


def test_unreadable_source_falls_back_to_the_nearest_older_table(tmp_path: Path) -> None:
    broken = tmp_path / "site"
    (broken / "sglang").mkdir(parents=True)
    (broken / "sglang" / "__init__.py").write_text("")
    fact = ReleaseFact("0.5.24", "dist-info:x", broken, None)
    tables = tables_for(fact, tmp_path / "cache")
    assert (tables.release, tables.requested, tables.origin) == ("0.5.23", "0.5.24", "nearest")
    no_source = ReleaseFact("0.5.24", "config", None, None)
    assert tables_for(no_source, tmp_path).origin == "nearest"
