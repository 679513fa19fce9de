"""Every backend constraint's release range is what the releases' own sources say.

tools/constraint_ranges.py wrote `sglang = "..."` (and `said`) on each constraint of
configs/backends.toml, configs/sglang/constraint-lines.json and model-backends.json from the
wheels; this recomputes them from the cached wheels (tools/fetch-sglang-wheels; CI fetches
them) and fails on any difference, so a range can never claim a release whose source lacks
the evidence (or the message).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglang_guard.preflight.compat import load_default_table
from sglang_guard.preflight.compat_table import load_raw_table
from sglang_guard.sglang.msgsearch import holds
from support.sglang import WHEELS_MISSING, missing

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("constraint_ranges",
                                               REPO / "tools" / "constraint_ranges.py")
assert _spec is not None and _spec.loader is not None
ranges = importlib.util.module_from_spec(_spec)
sys.modules["constraint_ranges"] = ranges
_spec.loader.exec_module(ranges)


def _wheels() -> dict[str, Path]:
    found = {}
    for v in ranges.releases():
        hits = sorted(ranges.wheel_dir().glob(f"sglang-{v}-*.whl"))
        if hits:
            found[v] = hits[0]
    return found


@pytest.fixture(scope="module")
def releases() -> list[Any]:
    wheels = _wheels()
    if len(wheels) < len(ranges.releases()):
        missing(WHEELS_MISSING)
    loaded = ranges.load_releases()
    assert loaded is not None
    return loaded


@pytest.fixture(scope="module")
def sources(releases: list[Any]) -> dict[str, str]:
    return {r.version: r.text for r in releases}


def test_every_written_range_is_what_the_wheels_say(releases: list[Any]) -> None:
    """`sglang` (behaviour: evidence, else message) and `said` (message) of every constraint,
    the evidence lines and the model allow-lists are what the wheels give today."""
    doc = tomllib.loads(ranges.TABLE.read_text(encoding="utf-8"))
    specs, lines = ranges.derive(doc, releases)
    wrong = []
    for name, i, _ in ranges.constraints(doc):
        have = doc["backends"][name]["constraints"][i]
        got = {k: have[k] for k in ("sglang", "said") if k in have}
        if got != specs[(name, i)]:
            wrong.append((name, i, got, specs[(name, i)]))
    assert wrong == [], "run tools/constraint_ranges.py --write"
    assert ranges.LINES.read_text(encoding="utf-8") == ranges.dump_lines(lines)
    assert ranges.MODEL_LISTS.read_text(encoding="utf-8") == ranges.dump_lines(
        ranges.model_lists(doc, releases))
    kv4 = json.loads(ranges.KV4.read_text(encoding="utf-8"))
    assert kv4 == ranges.kv4_runs(doc, releases)
    assert kv4, "no release's KV4 checks were read"
    assert ranges.KV_SM.read_text(encoding="utf-8") == ranges.dump_lines(
        ranges.kv_sm_runs(doc, releases))


def test_every_release_that_takes_an_sm_limited_kv_dtype_has_its_check(
        releases: list[Any]) -> None:
    """A release whose parser takes a [[kv_sm]] dtype and whose source lacks the check would
    only warn: none of the shipped ones does, and each one's line holds the message."""
    doc = tomllib.loads(ranges.TABLE.read_text(encoding="utf-8"))
    runs = ranges.kv_sm_runs(doc, releases)
    by_version = {r.version: r for r in releases}
    for spec in doc["kv_sm"]:
        takes = [r.version for r in releases if spec["dtype"] in r.kv_dtypes]
        covered = [r.version for r in releases
                   for first, last, cite in runs[spec["dtype"]]
                   if cite and Version(first) <= Version(r.version) <= Version(last)]
        assert takes and covered == takes, spec["dtype"]
        for first, _, cite in runs[spec["dtype"]]:
            path, line = cite.rsplit(":", 1)
            raw = by_version[first].files[path].splitlines()
            assert spec["message"][:24] in raw[int(line) - 1], (first, cite)


def test_evidence_ranges_cover_every_release_that_has_the_backend(
        releases: list[Any]) -> None:
    """The constraints read from behaviour hold on every release whose parser accepts the
    backend (the H200 record: 0.5.17 died on each of them)."""
    doc = tomllib.loads(ranges.TABLE.read_text(encoding="utf-8"))
    by_version = {r.version: r for r in releases}
    for name, backend in doc["backends"].items():
        for i, c in enumerate(backend.get("constraints", [])):
            if "evidence" not in c or name == "intel_xpu":
                continue
            spec = SpecifierSet(c["sglang"])
            missing = [v for v, r in by_version.items()
                       if name in r.backends and not spec.contains(v, prereleases=True)]
            assert missing == [], (name, i, missing)
    xpu = SpecifierSet(doc["backends"]["intel_xpu"]["constraints"][0]["sglang"])
    assert xpu.contains("0.5.17") and not xpu.contains("0.5.4")


def test_every_constraint_states_its_releases() -> None:
    missing = [(b.name, c.kind) for b in load_raw_table().backends for c in b.constraints
               if not c.sglang]
    assert missing == []
    assert load_default_table().sglang_version == "0.5.23"


_rspec = importlib.util.spec_from_file_location("rule_ranges", REPO / "tools" / "rule_ranges.py")
assert _rspec is not None and _rspec.loader is not None
rule_ranges = importlib.util.module_from_spec(_rspec)
_rspec.loader.exec_module(rule_ranges)


def test_every_rule_range_written_from_the_wheels_is_what_they_say(
        sources: dict[str, str]) -> None:
    """Each range tools/rule_ranges.py wrote is what the wheels say today (hand-written ranges,
    read from messages quoted with their values filled in, are the pack's own claim)."""
    versions = sorted(sources, key=Version)
    texts = [sources[v] for v in versions]
    raw = rule_ranges.PACK.read_text(encoding="utf-8")
    marked = set(re.findall(r'(?ms)^id = "([^"]+)"(?:(?!^\[\[rules\]\]).)*?' +
                            re.escape(rule_ranges.MARK), raw))
    assert marked, "the pack carries no range written by tools/rule_ranges.py"
    pack = {r["id"]: r for r in tomllib.loads(raw)["rules"]}
    by_rule = rule_ranges.messages_by_rule()
    wrong = []
    for rid in sorted(marked):
        present = [any(holds(t, m) for m in by_rule[rid]) for t in texts]
        want = rule_ranges.open_below(ranges.spec_for(present, versions, versions[-1]),
                                      versions[0])
        if pack[rid]["when"]["sglang"] != want:
            wrong.append((rid, pack[rid]["when"]["sglang"], want))
    assert wrong == [], "run tools/rule_ranges.py --write"
