"""The shipped per-release tables: the loader, the edit scripts, and what the data must say."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest

from sglang_guard.errors import ConfigError
from sglang_guard.resources import config_path
from sglang_guard.sglang import releases
from sglang_guard.sglang.releases import load_option_table


def normalised(table: dict[str, Any], unordered: set[str]) -> dict[str, Any]:
    """What an argparse dump and a static table share: options, with set-valued choices sorted
    (their order is Python's hash order)."""
    def one(o: dict[str, Any]) -> dict[str, Any]:
        if o["dest"] in unordered and o["choices"] is not None:
            return {**o, "choices": sorted(o["choices"])}
        return o

    return {
        "sglang_version": table["sglang_version"],
        "allow_abbrev": table["allow_abbrev"],
        "options": [one(o) for o in table["options"]],
    }


def _dump() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(config_path("sglang", "options-0.5.23.json").read_text())
    return data


def test_generated_0523_table_equals_the_argparse_dump() -> None:
    generated = releases.shipped_table("0.5.23")
    unordered = set(generated["unordered_choices"])
    assert unordered == {"sampling_backend"}
    dump = _dump()
    # A default the static reader could not evaluate is left out of the table (never guessed;
    # 12 of 531 in 0.5.23, e.g. `1024 * 1024`); every one it has equals the parser's.
    seen = {tuple(o["strings"]) for o in generated["options"] if "default" in o}
    assert len(seen) > 0.9 * len(generated["options"])
    dump["options"] = [{k: v for k, v in o.items()
                        if k != "default" or tuple(o["strings"]) in seen}
                       for o in dump["options"]]
    want = json.dumps(normalised(dump, unordered), indent=1)
    have = json.dumps(normalised(generated, unordered), indent=1)
    assert have == want


def test_every_release_is_replayed_and_reencoded_identically() -> None:
    raw = json.loads(config_path(*releases.RELEASES_FILE).read_text())
    decoded = releases.decode_chain(raw)
    assert len(decoded) == 42
    order = list(decoded.values())  # newest first, as stored
    assert releases.encode_chain(order) == raw
    for version, table in decoded.items():
        strings = [s for o in table["options"] for s in o["strings"]]
        assert len(strings) == len(set(strings)), f"{version}: an option string twice"
        assert releases.load_release(version).options.sglang_version == version


def test_the_newest_table_decoded_alone_is_the_whole_files(
        monkeypatch: pytest.MonkeyPatch) -> None:
    text = config_path(*releases.RELEASES_FILE).read_text()
    assert text.startswith(releases._NEWEST_AT)  # as tools/sglang_tables.py writes it
    whole = json.loads(text)
    monkeypatch.setattr(releases, "_NEWEST", [])
    monkeypatch.setattr(releases, "_RAW", [])
    assert releases._newest() == whole["newest"]
    assert releases._RAW == []  # the chain was not decoded
    assert releases.newest_release() == releases.known_releases()[-1] == "0.5.23"
    assert releases.shipped_table("0.5.23") == releases.decode_chain(whole)["0.5.23"]
    # a file written another way (keys reordered) is decoded whole, to the same answer
    monkeypatch.setattr(releases, "_NEWEST", [])
    monkeypatch.setattr(releases, "_RAW", [])
    monkeypatch.setattr(releases, "_read", lambda: json.dumps(
        {"chain": whole["chain"], "newest": whole["newest"], "format": 1}))
    assert releases._newest() == whole["newest"] and releases._RAW != []


@pytest.mark.parametrize(
    ("newer", "older"),
    [([], []), (["a", "b", "c"], ["a", "c"]), (["a"], ["x", "a", "y"]), (["a", "b"], ["b", "a"]),
     (["a", "b", "c", "d"], ["d", "c", "b", "a"])],
)
def test_edit_scripts_round_trip(newer: list[str], older: list[str]) -> None:
    def entries(keys: list[str]) -> list[dict[str, Any]]:
        return [{"strings": [f"--{k}"], "dest": k} for k in keys]

    ops = releases.encode_ops(entries(newer), entries(older))
    assert releases.apply_ops(entries(newer), ops) == entries(older)


def test_a_script_that_does_not_cover_its_base_is_refused() -> None:
    with pytest.raises(ValueError, match="covers 1 of 2"):
        releases.apply_ops([{"strings": ["--a"]}, {"strings": ["--b"]}], [1])


def test_known_releases_run_from_051_to_0523() -> None:
    known = releases.known_releases()
    assert known[0] == "0.5.1"
    assert known[-1] == "0.5.23"
    listed = [ln for ln in config_path("sglang", "releases.txt").read_text().splitlines()
              if ln and not ln.startswith("#")]
    assert list(known) == listed


@pytest.mark.parametrize(
    ("asked", "got", "exact"),
    [("0.5.18", "0.5.18", True), ("0.5.24", "0.5.23", False), ("0.5.12.post2", "0.5.12.post1",
     False), ("0.5.24.dev0+g1234", "0.5.23", False), ("0.5.15.post1", "0.5.15.post1", True)],
)
def test_nearest_older_release(asked: str, got: str, exact: bool) -> None:
    tables = releases.load_release(asked)
    assert (tables.release, tables.exact, tables.requested) == (got, exact, asked)
    assert tables.origin == ("shipped" if exact else "nearest")


@pytest.mark.parametrize("asked", ["0.4.10", "not-a-version"])
def test_no_table_older_than_the_oldest(asked: str) -> None:
    with pytest.raises(ConfigError, match="no table for SGLang"):
        releases.load_release(asked)


def test_load_option_table_keeps_working_and_reads_other_releases() -> None:
    assert load_option_table().sglang_version == "0.5.23"
    assert len(load_option_table().options) == 531
    old = load_option_table("0.5.12")
    assert "--cuda-graph-max-bs" in old.by_string
    assert "--cuda-graph-max-bs-decode" not in old.by_string
    with pytest.raises(ConfigError):
        load_option_table("0.5.24")  # not shipped: no silent nearest-older here


# Facts the issue states from the releases' own source; the tables must agree.
@pytest.mark.parametrize(
    ("version", "backend", "kv", "max_bs", "max_bs_decode"),
    [
        ("0.5.10", True, True, True, False),
        ("0.5.13", True, True, True, False),
        ("0.5.14", True, True, True, True),
        ("0.5.19", True, True, True, True),
        ("0.5.20", False, True, False, True),
        ("0.5.21", False, False, False, True),
        ("0.5.23", False, False, False, True),
    ],
)
def test_release_facts(version: str, backend: bool, kv: bool, max_bs: bool,
                       max_bs_decode: bool) -> None:
    t = releases.load_release(version)
    assert ("cutlass_mla" in t.choices["attention_backend"]) is backend
    assert ("fp4_e2m1" in t.choices["kv_cache_dtype"]) is kv
    assert ("--cuda-graph-max-bs" in t.options.by_string) is max_bs
    assert ("--cuda-graph-max-bs-decode" in t.options.by_string) is max_bs_decode


def test_cli_growth_matches_the_count_in_issue_11() -> None:
    a = set(releases.load_release("0.5.10").options.by_string)
    b = set(releases.load_release("0.5.23").options.by_string)
    assert (len(a), len(b), len(b - a), len(a - b)) == (365, 559, 226, 32)


def test_0523_arch_lists_equal_the_curated_attention_arch_table() -> None:
    arch = releases.load_release("0.5.23").arch
    curated = tomllib.loads(config_path("attention-arch.toml").read_text())
    mla = {a for r in curated["rules"] if r["arch"] == "mla" and "when" not in r
           for a in r["any_of"]}
    conditional = {a for r in curated["rules"] if r["arch"] == "mla" and "when" in r
                   for a in r["any_of"]}
    assert set(arch.mla) == mla
    assert set(arch.mla_conditional) == conditional
    ssm = {a for r in curated["rules"] if r["arch"] == "ssm" for a in r["any_of"]}
    assert set(arch.ssm) == ssm
    # Every unconditional draft rename read from the source is curated identically; the
    # curated table also holds the DeepSeek-V4 one, which the source makes conditional.
    for name, renamed in arch.draft_renames.items():
        if name in curated["draft_renames"]:
            assert curated["draft_renames"][name] == renamed
    assert arch.draft_renames_conditional["DeepseekV4ForCausalLM"] == "DeepseekV4ForCausalLMNextN"


def test_old_release_arch_lists() -> None:
    arch = releases.load_release("0.5.1").arch
    assert "DeepseekV3ForCausalLM" in arch.mla
    assert "DeepseekV32ForCausalLM" not in arch.mla
    assert arch.draft_renames["MiMoForCausalLM"] == "MiMoMTP"


def test_deprecations_are_carried_per_release() -> None:
    dep = releases.load_release("0.5.23").deprecated
    assert "--disable-cuda-graph" in dep
    assert "cuda-graph-backend" in dep["--disable-cuda-graph"]
    assert "server_args.py:" in dep["--disable-cuda-graph"]
