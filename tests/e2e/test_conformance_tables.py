"""The guard's data tables against the installed SGLang: same version, same parser.

A wrong SGLang pin, or an option table that drifted from SGLang's own argparse, fails here
with a message that names what disagrees.
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.resources import config_path
from sglang_guard.sglang.releases import load_option_table

REPO = Path(__file__).resolve().parents[2]
EXTRACT = REPO / "tools" / "extract_sglang_options.py"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fresh_dump(sglang_python: str) -> dict[str, Any]:
    """SGLang's parser dumped now, from the installed SGLang."""
    out = subprocess.run([sglang_python, str(EXTRACT)], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, f"extract_sglang_options.py failed:\n{out.stderr[-2000:]}"
    dump: dict[str, Any] = json.loads(out.stdout)
    return dump


def test_installed_sglang_is_the_version_every_table_was_read_from(
    fresh_dump: dict[str, Any],
) -> None:
    installed = fresh_dump["sglang_version"]
    tables = {
        "configs/sglang/options-*.json": load_option_table().sglang_version,
        "configs/attention-arch.toml": tomllib.loads(
            config_path("attention-arch.toml").read_text())["meta"]["sglang_version"],
        "configs/backends.toml": tomllib.loads(
            config_path("backends.toml").read_text())["meta"]["sglang_version"],
    }
    wrong = {name: v for name, v in tables.items() if v != installed}
    assert not wrong, f"installed SGLang is {installed}, but these tables were read from: {wrong}"


def _comparable(option: dict[str, Any]) -> dict[str, Any]:
    # Some SGLang choices are sets: their order changes between runs, their meaning does not.
    choices = option["choices"]
    return {**option, "choices": sorted(choices) if choices is not None else None}


def test_shipped_option_table_is_sglangs_own_parser(fresh_dump: dict[str, Any]) -> None:
    shipped = json.loads(config_path("sglang", "options-0.5.23.json").read_text())
    have = {tuple(o["strings"]): _comparable(o) for o in shipped["options"]}
    want = {tuple(o["strings"]): _comparable(o) for o in fresh_dump["options"]}
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    changed = sorted(k for k in set(want) & set(have) if want[k] != have[k])
    assert not (missing or extra or changed), (
        f"the guard's option table differs from SGLang {fresh_dump['sglang_version']}'s parser: "
        f"missing {missing[:5]}, not in SGLang {extra[:5]}, changed {changed[:5]} "
        "(regenerate with tools/extract_sglang_options.py)")
