"""Preflight against SGLang's own argument phase as recorded on an H200 (SM90).

tests/data/h200-conformance-0.5.23.jsonl holds, for each command line, what SGLang 0.5.23's
argument phase (prepare_server_args, resolve_once, check_server_args) said on a real H200:
accepted, or rejected with its message and the frame that raised it (tools/h200/ made it;
its first line says when and with what). Here, on CPU, `check --gpu-sm 90` runs on each line:

- every line SGLang rejected is caught (a finding that drops, rewrites or refuses a flag);
- no line SGLang accepted is refused or changed for a reason the argument phase decides
  (a finding whose rule is an "args"-phase rule). Findings for later phases (backend
  construction, model init, kernels, weight loading) may stand: the argument phase never
  reaches them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.config.guardconfig import PolicyConfig
from sglang_guard.preflight.compat import BACKEND_FLAGS, CompatTable, load_default_table
from sglang_guard.preflight.preflight import Decision, Finding
from sglang_guard.preflight.shell.inputs import decide, gather
from sglang_guard.preflight.shell.whichrelease import Release, resolve_release
from sglang_guard.preflight.sizes import phase_of

DATA = Path(__file__).resolve().parents[1] / "data"
RECORD = DATA / "h200-conformance-0.5.23.jsonl"
MODELS = DATA / "h200-models"
FATAL = ("refuse", "drop", "rewrite")
_SLOT = dict(zip(BACKEND_FLAGS, ("attention", "prefill", "decode", "draft"), strict=True))
# The sgl_kernel stand-in: a line with no backend flag had its backend picked by SGLang
# (overrides.py:_attention_backend_default -> get_default_attn_backend, which probes for
# an installed flashinfer), and a real install may pick another. No asserted verdict rests
# on that pick: GPT-OSS's default is chosen by the SM alone (model_overrides/gpt_oss.py:
# 29-44: fa3 on SM90), and every other such line was accepted or rejected for a reason
# that reads no backend (context length, quantization, sizes). The guard's own verdict on
# those lines reads no backend either: test_auto_backend_lines_get_no_backend_finding.


def _rows() -> list[dict[str, Any]]:
    lines = RECORD.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[1:] if line.strip()]


def _auto_backend(row: dict[str, Any]) -> bool:
    return not any(a in BACKEND_FLAGS for a in row["argv"])


@pytest.fixture(scope="module")
def facts_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One facts cache for the module: six AutoConfig loads, not one a line."""
    return tmp_path_factory.mktemp("h200-facts")


@pytest.fixture(autouse=True)
def _shared_cache(monkeypatch: pytest.MonkeyPatch, facts_cache: Path) -> Iterator[None]:
    monkeypatch.setenv("SGLANG_GUARD_CACHE", str(facts_cache))
    yield


@cache
def _release() -> Release:
    return resolve_release(version="0.5.23", version_source="the H200 record", python=None)


def _decide(row: dict[str, Any]) -> Decision:
    argv = [a.replace("{models}", str(MODELS)) for a in row["argv"]]
    return decide(gather(argv, "90", _release()), PolicyConfig(), str(MODELS.parent / "no-state"))


def _phase(compat: CompatTable, f: Finding) -> str:
    """The phase of the rule behind a finding: preflight/sizes.py's, or the backend table's."""
    source = (f.source or "").split(" (")[0]
    own = phase_of(source)
    if own is not None:
        return own
    backend = compat.backend(f.value or "")
    if backend is None:
        return "args"  # an unknown backend name: argparse's choices
    if backend.alias is not None and f.kind == "deprecated":
        return "args"
    target = compat.backend(backend.alias.canonical) if backend.alias else backend
    phases = {c.phase for b in (backend, target) if b is not None for c in b.constraints
              if c.kind == f.kind and c.source == source and _SLOT.get(f.flag) in c.slots}
    return "args" if "args" in phases else (min(phases) if phases else "unknown")


def test_the_record_is_the_h200_run() -> None:
    meta = json.loads(RECORD.read_text(encoding="utf-8").splitlines()[0])["meta"]
    assert meta["sglang"] == "0.5.23"
    assert "H200" in meta["gpu"]
    rows = _rows()
    assert len(rows) >= 300
    assert {r["outcome"] for r in rows} == {"accepted", "rejected"}  # no harness errors
    again = {r["id"]: r["outcome"] for r in rows}
    for cid, outcome in again.items():
        if cid.endswith(",again"):
            assert again[cid.removesuffix(",again")] == outcome


@pytest.mark.parametrize("row", [r for r in _rows() if r["outcome"] == "rejected"],
                         ids=lambda r: r["id"])
def test_every_line_sglang_rejected_is_caught(row: dict[str, Any]) -> None:
    d = _decide(row)
    fatal = [f for f in d.findings if f.action in FATAL]
    assert fatal, f"SGLang rejected it ({row.get('message', '')[:160]}); preflight let it pass"
    if d.verdict != "refused":
        assert d.argv_out != d.argv_in


@pytest.mark.parametrize("row", [r for r in _rows() if r["outcome"] == "accepted"],
                         ids=lambda r: r["id"])
def test_no_line_sglang_accepted_is_refused_for_an_argument_phase_reason(
        row: dict[str, Any]) -> None:
    compat = load_default_table()
    d = _decide(row)
    wrong = [(f.flag, f.value, f.source) for f in d.findings
             if f.action in FATAL and _phase(compat, f) == "args"]
    assert not wrong, f"SGLang's argument phase accepted this line; preflight: {wrong}"


def test_auto_backend_lines_get_no_backend_finding() -> None:
    rows = [r for r in _rows() if _auto_backend(r)]
    assert len(rows) > 100
    for row in rows:
        d = _decide(row)
        assert not [f for f in d.findings if f.flag in BACKEND_FLAGS], row["id"]
