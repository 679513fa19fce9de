"""config/shell/tablecache.py: the backend table's decoded TOML kept as JSON, keyed by the file."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from sglang_guard.config.shell import tablecache
from sglang_guard.errors import ConfigError
from sglang_guard.preflight import compat_table
from sglang_guard.resources import config_path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SGLANG_GUARD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tables"


def test_the_copy_decodes_as_tomllib_does_and_is_read_back(cache: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = config_path("backends.toml")
    want = tomllib.loads(path.read_text(encoding="utf-8"))
    assert tablecache.decoded_toml(path) == want  # a miss: decoded, the copy written
    [copy] = cache.glob("backends-*.json")
    assert json.loads(copy.read_bytes()) == want

    def no_toml(text: str, where: str) -> None:
        raise AssertionError("decoded again")

    monkeypatch.setattr(tablecache, "load", no_toml)
    assert tablecache.decoded_toml(path) == want  # a hit: the copy, no TOML decoding
    # The same table either way: the raw table parsed from the copy equals tomllib's.
    assert (compat_table.parse_table("", str(path), tablecache.decoded_toml(path))
            == compat_table.parse_table(path.read_text(encoding="utf-8"), str(path)))


def test_an_edited_file_gets_a_new_copy_and_a_broken_copy_is_decoded_afresh(
        cache: Path, tmp_path: Path) -> None:
    table = tmp_path / "t.toml"
    table.write_text('a = "one"\n')
    assert tablecache.decoded_toml(table) == {"a": "one"}
    table.write_text('a = "two"\n')  # same size, other bytes: another key
    assert tablecache.decoded_toml(table) == {"a": "two"}
    assert len(list(cache.glob("t-*.json"))) == 2
    for copy in cache.glob("t-*.json"):
        copy.write_text("{not json")
    assert tablecache.decoded_toml(table) == {"a": "two"}
    table.write_text("a = 1979-05-27\n")  # a TOML date: no JSON copy, decoded each time
    assert str(tablecache.decoded_toml(table)["a"]) == "1979-05-27"
    table.write_text("a = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        tablecache.decoded_toml(table)
