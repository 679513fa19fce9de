"""The fast transformers import (bare packages before AutoConfig) gives the normal answers.

Each way runs in its own interpreter (which transformers modules are loaded is the point):
the 8 shipped model configs, their facts resolved without the cache, and `check --json` for
each with 3 attention backends. "broken" stands for a transformers whose layout the fast
way does not fit: it must fall back to the normal import and still agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
MODELS = sorted(str(p.parent) for d in ("configs/models", "tests/data/h200-models")
                for p in (REPO / d).glob("*/config.json"))
BACKENDS = ("fa3", "flashinfer", "triton")
PROBE = r"""
import json, os, sys, types
from click.testing import CliRunner
from sglang_guard.cli import main
from sglang_guard.preflight.shell import modelprobe
models, backends, way = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
if way == "broken":
    modelprobe._BARE = (*modelprobe._BARE, "transformers.models.no_such_package")
out = {"facts": {}, "check": {}}
for m in models:
    f = modelprobe.resolve_model(m, use_cache=False)
    out["facts"][m] = [f.architectures, f.attention_arch, f.model_type, f.warning,
                       f.shape.as_dict() if f.shape else None]
    for b in backends:
        res = CliRunner().invoke(main, ["check", "--json", "--gpu-sm", "90", "--",
                                        "--model-path", m, "--attention-backend", b])
        try:
            out["check"][f"{m} {b}"] = [res.exit_code, json.loads(res.stdout)]
        except ValueError:
            raise SystemExit(f"{m} {b}: {res.exit_code} {res.output[-2000:]}") from None
top = sys.modules.get("transformers")
out["bare"] = type(top) is types.ModuleType
print(json.dumps(out))
"""


def _answers(way: str, tmp: Path) -> dict[str, Any]:
    env = {**os.environ, "SGLANG_GUARD_CACHE": str(tmp / way), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error",
           "SGLANG_GUARD_TRANSFORMERS_FAST": "0" if way == "normal" else "1"}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(MODELS), json.dumps(BACKENDS),
                           way], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


@pytest.fixture(scope="module")
def normal(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("transformers")
    return _answers("normal", tmp_path_factory.mktemp("normal"))


def test_every_shipped_model_is_compared() -> None:
    # the tiny CPU ones, the GPU-shaped ones and the H200 conformance configs
    assert len(MODELS) >= 8
    assert {"tiny-llama", "tiny-deepseek-v3", "llama-hd128", "dsv3-mla576"} <= {
        Path(m).name for m in MODELS}


@pytest.mark.parametrize("way", ["fast", "broken"])
def test_fast_and_fallback_agree_with_the_normal_import(
        way: str, normal: dict[str, Any], tmp_path: Path) -> None:
    found = _answers(way, tmp_path)
    assert normal["bare"] is False  # the normal import ran transformers' __init__
    assert found["bare"] is (way == "fast")  # the fast way did not; the broken one fell back
    assert found["facts"] == normal["facts"]
    assert len(found["check"]) == len(MODELS) * len(BACKENDS)
    assert found["check"] == normal["check"]
    # the answers hold real content: architectures found, and a backend decision each
    assert all(f[0] for f in normal["facts"].values())
