"""A `check` whose model facts are cached imports neither transformers nor pynvml nor
importlib.metadata, nor tomllib (the backend table's decoded copy is cached too), nor the
supervisor's jobs and events, nor click (a plain command line: checkcmd.py); where NVML's
library is absent, the probe says what NVML would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_guard.preflight.shell import gpuprobe

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "configs" / "models" / "tiny-llama"
WRAPPER = """
import atexit, json, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv[0] = "sglang-guard"
runpy.run_module("sglang_guard", run_name="__main__")
"""


def _check_modules(tmp: Path, name: str) -> set[str]:
    out = tmp / f"{name}.json"
    env = {**os.environ, "SGLANG_GUARD_CACHE": str(tmp / "cache"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error",
           "SGLANG_GUARD_WARM_PROBE": "0"}  # the cold one resolves in this process
    done = subprocess.run([sys.executable, "-c", WRAPPER, str(out), "check", "--json",
                           "--gpu-sm", "auto", "--", "--model-path", str(MODEL)],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert json.loads(done.stdout)["model"]["architectures"] == ["LlamaForCausalLM"]
    return set(json.loads(out.read_text()))


def test_cached_check_imports_little(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    cold = _check_modules(tmp_path, "cold")
    assert "transformers.models.auto.configuration_auto" in cold  # it resolved the model
    cached = _check_modules(tmp_path, "cached")
    assert not {m for m in cached if m.split(".")[0] == "transformers"}
    assert "importlib.metadata" not in cached
    assert "tomllib" in cold and "tomllib" not in cached  # the table's copy was read
    assert not cached & {"sglang_guard.supervise.shell.jobs", "sglang_guard.supervise.events",
                         "difflib",
                         "socket", "queue", "click",
                         "signal", "fcntl", "string",  # an init's, a lock's, Template's
                         "sglang_guard.sglang.shell.release",  # --python only
                         "sglang_guard.sglang.msgsearch"}  # an unshipped release only
    if gpuprobe._no_nvml_library() is not None or gpuprobe._probe_ctypes() is not None:
        assert "pynvml" not in cached  # no NVIDIA driver here, or NVML answered through ctypes


def test_missing_nvml_library_answers_as_nvml_does() -> None:
    pynvml = pytest.importorskip("pynvml")
    early = gpuprobe._no_nvml_library()
    if early is None:
        pytest.skip("this host has libnvidia-ml.so.1")
    assert early == gpuprobe.probe_gpu(pynvml)  # the real nvmlInit's failure, word for word
    assert gpuprobe.probe_gpu() == early
