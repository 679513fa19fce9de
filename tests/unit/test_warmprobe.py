"""A cold `check` resolves its model in a forked, warm child and says what it says without
one (preflight/shell/warmprobe.py).

Each check runs as the console script does, in its own interpreter: with the child, the
parent never imports transformers and the child answered; without (SGLANG_GUARD_WARM_PROBE=0)
the parent resolves itself. Both print the same decision, exit alike and write the same
facts to the cache; a cached check forks nothing; a model the child cannot resolve is
resolved again by the parent, in its own words; a child nobody asks is gone when the check
has exited; nothing forks beside a second thread.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.preflight.shell import warmprobe

REPO = Path(__file__).resolve().parents[2]
MODELS = sorted(str(p.parent) for p in (REPO / "configs" / "models").glob("*/config.json"))
WRAPPER = """
import atexit, json, runpy, sys
out = sys.argv.pop(1)
def dump():
    from sglang_guard.preflight.shell import warmprobe
    open(out, "w").write(json.dumps({"transformers": "transformers" in sys.modules,
                                     **warmprobe.state()}))
atexit.register(dump)
sys.argv[0] = "sglang-guard"
runpy.run_module("sglang_guard", run_name="__main__")
"""


def check(tmp: Path, cache: str, args: list[str], *, warm: bool = True,
          fast: bool = True) -> tuple[int, str, str, dict[str, Any]]:
    """(exit status, stdout, stderr, what the process did) of one `check`."""
    seen = tmp / "seen.json"
    env = {**os.environ, "SGLANG_GUARD_CACHE": str(tmp / cache), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error", "SGLANG_GUARD_WARM_PROBE": "1" if warm else "0",
           "SGLANG_GUARD_TRANSFORMERS_FAST": "1" if fast else "0"}
    done = subprocess.run([sys.executable, "-c", WRAPPER, str(seen), "check", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    return done.returncode, done.stdout, done.stderr, json.loads(seen.read_text())


def facts(tmp: Path, cache: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in (tmp / cache / "facts").glob("*.json")}


def test_the_shipped_models_are_compared() -> None:
    assert {"tiny-llama", "tiny-deepseek-v3", "llama-hd128", "dsv3-mla576"} <= {
        Path(m).name for m in MODELS}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: Path(m).name)
def test_a_cold_check_resolves_in_the_child_and_decides_as_without_it(
        model: str, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    args = ["--json", "--gpu-sm", "90", "--", "--model-path", model,
            "--attention-backend", "flashinfer"]
    warm = check(tmp_path, "warm", args)
    cold = check(tmp_path, "cold", args, warm=False)
    assert warm[3]["forked"] == 1 and warm[3]["answered"] == 1
    assert warm[3]["transformers"] is False  # the parent never imported it
    assert cold[3]["forked"] == 0 and cold[3]["transformers"] is True
    assert warm[:3] == cold[:3]
    assert json.loads(warm[1])["model"]["architectures"]
    assert facts(tmp_path, "warm") == facts(tmp_path, "cold") != {}
    cached = check(tmp_path, "warm", args)
    assert cached[3] == {"transformers": False, "forked": 0, "answered": 0, "pid": 0}
    assert cached[:3] == warm[:3]


def test_the_normal_import_in_the_child_decides_alike(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    args = ["--json", "--gpu-sm", "90", "--", "--model-path", MODELS[0]]
    normal = check(tmp_path, "normal", args, fast=False)
    assert normal[3]["answered"] == 1
    assert normal[:3] == check(tmp_path, "cold", args, warm=False)[:3]


@pytest.mark.parametrize("config", [
    {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": "big"},
    {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_attention_heads": 0,
     "hidden_size": 64},
], ids=["a-field-of-the-wrong-type", "a-division-by-zero"])
def test_what_the_child_cannot_resolve_the_parent_resolves_in_its_own_words(
        config: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    args = ["--gpu-sm", "90", "--", "--model-path", str(model)]
    warm = check(tmp_path, "warm", args)
    assert warm[3]["forked"] == 1 and warm[3]["answered"] == 0
    assert warm[:3] == check(tmp_path, "cold", args, warm=False)[:3]
    assert warm[0] == 2 and "transformers rejects this config" in warm[2]


def test_a_child_nobody_asks_is_gone_when_the_check_exits(tmp_path: Path) -> None:
    status, _, err, seen = check(tmp_path, "c", ["--", "--model-path", MODELS[0], "--config",
                                                 str(tmp_path / "missing.yaml")])
    assert status == 2 and "file not found" in err
    assert seen["forked"] == 1 and seen["answered"] == 0
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left importing
        os.kill(seen["pid"], 0)


def test_nothing_forks_beside_a_second_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked"))
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert warmprobe.start(["--model-path", MODELS[0]]) is False
    finally:
        release.set()
        other.join()


def test_nothing_forks_off_linux_or_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked"))
    monkeypatch.setattr(sys, "platform", "darwin")
    assert warmprobe.start(["--model-path", MODELS[0]]) is False
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("SGLANG_GUARD_WARM_PROBE", "0")
    assert warmprobe.start(["--model-path", MODELS[0]]) is False


def test_the_model_path_is_read_only_where_it_is_plain(tmp_path: Path) -> None:
    model = MODELS[0]
    assert warmprobe._model_path(["--model-path", model]) == model
    assert warmprobe._model_path(["--model", model, "--tp", "2"]) == model
    assert warmprobe._model_path([f"--model-path={model}"]) == model
    assert warmprobe._model_path(["--model-path", str(tmp_path)]) is None  # no config.json
    assert warmprobe._model_path(["--model-p", model]) is None  # an abbreviation: no guess
    assert warmprobe._model_path(["--model-path"]) is None
