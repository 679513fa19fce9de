"""Every backend constraint's release range is what the releases' own sources say.

tools/constraint_ranges.py wrote `sglang = "..."` on each constraint of configs/backends.toml
from the wheels; this recomputes it from the cached wheels (tools/fetch-sglang-wheels; CI
fetches them) and fails on any difference, so a range can never claim a release whose source
lacks the message.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

from sglang_guard.core.compat import load_default_table
from sglang_guard.core.compat_table import load_raw_table
from sglang_guard.core.msgsearch import holds, parts
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
def sources() -> dict[str, str]:
    wheels = _wheels()
    if len(wheels) < len(ranges.releases()):
        missing(WHEELS_MISSING)
    return {v: ranges.source_text(w) for v, w in wheels.items()}


def test_every_written_range_is_what_the_wheels_say(sources: dict[str, str]) -> None:
    versions = sorted(sources, key=Version)
    texts = [sources[v] for v in versions]
    doc = tomllib.loads(ranges.TABLE.read_text(encoding="utf-8"))
    read_from = doc["meta"]["sglang_version"]
    wrong = []
    for name, i, message in ranges.constraints(doc):
        want = (f"=={read_from}" if message is None or not parts(message)
                else ranges.spec_for([holds(t, message) for t in texts], versions, read_from))
        have = doc["backends"][name]["constraints"][i].get("sglang")
        if have != want:
            wrong.append((name, i, have, want))
    assert wrong == [], "run tools/constraint_ranges.py --write"


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
