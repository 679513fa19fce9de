"""The per-release tables against the installed SGLang: its version read from disk, its
source read statically, and its own parser."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.sglang.releases import shipped_table
from sglang_guard.sglang.shell.release import derive_release, read_release

REPO = Path(__file__).resolve().parents[2]
EXTRACT = REPO / "tools" / "extract_sglang_options.py"

pytestmark = pytest.mark.e2e


def _comparable(table: dict[str, Any]) -> list[dict[str, Any]]:
    # Set-valued choices come out in hash order from a live parser.
    return [{**o, "choices": sorted(o["choices"]) if o["choices"] is not None else None}
            for o in table["options"]]


def test_version_is_read_from_the_dist_info_without_importing(sglang_python: str) -> None:
    fact = read_release(sglang_python)
    assert fact is not None
    assert fact.version == "0.5.23"
    assert fact.source.startswith("dist-info:")
    assert fact.source.endswith("sglang-0.5.23.dist-info/METADATA")


def test_installed_source_derives_the_shipped_table(sglang_python: str, tmp_path: Path) -> None:
    fact = read_release(sglang_python)
    assert fact is not None
    derived = derive_release(fact, tmp_path)
    want = shipped_table("0.5.23")
    assert [list(o.strings) for o in derived.options.options] == [
        o["strings"] for o in want["options"]]
    assert derived.choices["attention_backend"] == tuple(
        next(o for o in want["options"] if o["dest"] == "attention_backend")["choices"])


def test_generated_table_is_the_installed_parser(sglang_python: str) -> None:
    out = subprocess.run([sglang_python, str(EXTRACT)], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    live = json.loads(out.stdout)
    assert live["sglang_version"] == "0.5.23"
    shipped = shipped_table("0.5.23")
    # A default the static reader could not evaluate is left out of the table, never guessed.
    seen = {tuple(o["strings"]) for o in shipped["options"] if "default" in o}
    live["options"] = [{k: v for k, v in o.items() if k != "default"
                        or tuple(o["strings"]) in seen} for o in live["options"]]
    assert _comparable(shipped) == _comparable(live)
