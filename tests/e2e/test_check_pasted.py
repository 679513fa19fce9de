"""`check` of a pasted command line decides for the release its interpreter runs: the real
0.5.18 and 0.5.23 CPU environments, named by path as a unit file's ExecStart= names them
(`<venv>/bin/python -m sglang.launch_server …`, `<venv>/bin/sglang serve …`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import RELEASES, python_for

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
LLAMA = str(REPO / "configs" / "models" / "tiny-llama")


def _check(words: list[str], *options: str) -> dict[str, object]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    done = subprocess.run([sys.executable, "-m", "sglang_guard", "check", "--json", *options,
                           "--", *words], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode in (0, 1), done.stderr
    said: dict[str, object] = json.loads(done.stdout)
    return said


@pytest.mark.parametrize("release", RELEASES)
def test_the_pasted_interpreters_release_is_the_one_decided_for(release: str) -> None:
    py = python_for(release)
    said = _check([py, "-m", "sglang.launch_server", "--model-path", LLAMA])
    assert said["sglang_version"] == release
    assert "dist-info" in str(said["sglang_version_source"])
    script = Path(py).with_name("sglang")
    if script.is_file():  # the console script beside it: the same environment
        assert _check([str(script), "serve", LLAMA])["sglang_version"] == release
    # what the user names wins over the pasted line
    told = _check([py, "-m", "sglang.launch_server", "--model-path", LLAMA],
                  "--sglang-version", "0.5.20")
    assert told["sglang_version"] == "0.5.20"


def test_a_pasted_interpreter_missing_here_falls_back_and_says_so() -> None:
    said = _check(["/no/such/venv/bin/python3", "-m", "sglang.launch_server",
                   "--model-path", LLAMA])
    assert "/no/such/venv/bin/python3 is not on this machine" in str(
        said["sglang_version_source"])
