"""`check` says the same read by click or plainly (checkcmd.plain_check_args), cold (no
cached facts, nor the backend table's decoded copy) or with its facts cached: stdout, stderr
and exit status of whole processes, for every shipped model config and three attention
backends, text and JSON, and for bad inputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODELS = sorted(str(p.parent) for d in ("configs/models", "tests/data/h200-models",
                                        "tests/data/documented-models")
                for p in (REPO / d).glob("*/config.json"))
BACKENDS = ("cutedsl_mla", "fa3", "triton")


CLICK_WAY = "import sys; from sglang_guard import cli; sys.argv[0] = 'sglang-guard'; cli.main()"


def _run(way: str, words: list[str], cache: Path) -> tuple[int, str, str]:
    env = {**os.environ, "SGLANG_GUARD_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error"}
    cmd = ([sys.executable, "-m", "sglang_guard"] if way == "plain"
           else [sys.executable, "-c", CLICK_WAY])
    done = subprocess.run([*cmd, *words], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    return done.returncode, done.stdout, done.stderr


def test_every_shipped_model_is_in_the_comparison() -> None:
    assert len(MODELS) >= 11
    assert {"tiny-llama", "tiny-deepseek-v3", "gpt-oss-20b", "qwen2.5-14b-instruct-1m"} <= {
        Path(m).name for m in MODELS}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: Path(m).name)
def test_plain_and_click_cold_and_cached_say_the_same(model: str, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    for n, (backend, as_json) in enumerate((b, j) for b in BACKENDS for j in ((), ("--json",))):
        words = ["check", *as_json, "--gpu-sm", "90", "--", "--model-path", model,
                 "--attention-backend", backend]
        cache = tmp_path / f"{backend}{len(as_json)}"
        if n in (0, 3):  # cold twice (text, JSON), with a cache of its own
            said = _run("plain", words, cache)  # nothing cached
            assert (cache / "facts").is_dir()
        else:
            cache = tmp_path / "shared"
            said = _run("click", words, cache)
        assert said[0] in (0, 1, 78), said[2][-2000:]
        if as_json:
            assert json.loads(said[1])["model"]["path"] == model
        assert _run("plain", words, cache) == said  # the facts cached
        assert _run("click", words, cache) == said


@pytest.mark.parametrize("words", [
    ["check", "--gpu-sm", "7", "--", "--model-path", "configs/models/tiny-llama"],
    ["check", "--", "--model-path", "/no/such/model"],
    ["check", "--config", "/no/such.toml", "--", "--model-path", "configs/models/tiny-llama"],
    ["check", "--sglang-version", "0.0.1", "--", "--model-path", "configs/models/tiny-llama"],
    ["check", "--json", "--", "--model-path", "configs/models/tiny-llama", "--no-such-flag"],
    ["check", "--policy", "fail", "--", "--model-path", "configs/models/tiny-deepseek-v3",
     "--attention-backend", "hpc_ops"],
])
def test_bad_inputs_are_said_the_same_both_ways(words: list[str], tmp_path: Path) -> None:
    plain = _run("plain", words, tmp_path)
    assert plain[0] in (1, 2, 78) and (plain[1] or plain[2].startswith("sglang-guard: ")), plain
    assert _run("click", words, tmp_path) == plain
