"""The precomputed option-spelling set equals what loading every shipped table gives."""

from __future__ import annotations

import json

import pytest

from sglang_guard.resources import config_path
from sglang_guard.rules.shell import packs
from sglang_guard.sglang.releases import known_releases, load_option_table


def test_shipped_spellings_equal_every_tables_canonical_spellings() -> None:
    slow = {s.canonical for v in known_releases() for s in load_option_table(v).options}
    shipped = json.loads(config_path(*packs.SPELLINGS_FILE).read_text(encoding="utf-8"))
    assert shipped == sorted(shipped)
    assert set(shipped) == slow


def test_other_release_has_reads_the_file_not_the_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    packs._spellings.cache_clear()
    loaded: list[str] = []
    monkeypatch.setattr(packs, "load_option_table", lambda v="": loaded.append(v))
    try:
        assert packs.other_release_has("--model-path")
        assert not packs.other_release_has("--no-such-option-anywhere")
        assert loaded == []
    finally:
        packs._spellings.cache_clear()
