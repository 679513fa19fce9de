"""`sglang-guard serve` leaves to SGLang what SGLang does not serve with the LLM server.

Each command line goes to the real release's own dispatch (oracle.py serve: sglang/cli/
serve.py's selector, positional model path and diffusion detector) and to the guard's
`serve.backend`. The guard judges (checks and supervises) a command only where the release
takes the LLM path: judging a diffusion command by launch_server's rules would refuse or
rewrite flags that are right there. Where the guard declines and an older release would
still take the LLM path (0.5.18 reads no modular_model_index.json: cli/utils.py:37-46),
SGLang's own answer shows as it would without the guard; on 0.5.23 the two agree exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_guard.sglang.launcher import serve_reading, split_args
from sglang_guard.sglang.shell.servebackend import backend

from .conftest import RELEASES, python_for, run_oracle

pytestmark = pytest.mark.e2e

DIRS: dict[str, dict[str, object]] = {
    "pipe": {"model_index.json": {"_diffusers_version": "0.30.0", "_class_name": "X"}},
    "modular": {"modular_model_index.json": {"_diffusers_version": "0.35.0"}},
    "nokey": {"model_index.json": {"_class_name": "X"}},
    "broken": {"model_index.json": "{not json"},
    "listed": {"model_index.json": ["_diffusers_version"]},  # `in` a list: a pipeline
    "numeric": {"model_index.json": "7"},  # `in` raises: the detector is skipped
    "null": {"model_index.json": "null"},
    "first": {"model_index.json": {"x": 1},
              "modular_model_index.json": {"_diffusers_version": "1"}},
    "llm": {"config.json": {"architectures": ["LlamaForCausalLM"]}},
}


def _cases(root: Path) -> list[list[str]]:
    for name, files in DIRS.items():
        d = root / name
        d.mkdir()
        for fname, body in files.items():
            (d / fname).write_text(body if isinstance(body, str) else json.dumps(body))
    cases: list[list[str]] = []
    for name in DIRS:
        d = str(root / name)
        cases += [[d], ["--model-path", d, "--port", "1"], [f"--model={d}"],
                  [d, "--model-type", "llm"], ["--model-type=diffusion", d]]
    return [*cases, ["--port", "1"], [str(root / "missing")], ["org/not-cached-model"]]


@pytest.mark.parametrize("release", RELEASES)
def test_the_guard_judges_only_what_the_release_serves_as_llm(
        release: str, tmp_path: Path) -> None:
    cases = _cases(tmp_path)
    theirs = run_oracle(python_for(release), "serve", cases)
    reading = serve_reading(release)  # as this release's serve.py reads the words
    ours = ["llm" if backend(*split_args(argv, reading), reading) is None else "other"
            for argv in cases]
    judged_not_llm = [(c, t) for c, t, o in zip(cases, theirs, ours, strict=True)
                      if o == "llm" and t != "llm"]
    assert judged_not_llm == []  # never a false judgement
    if release == "0.5.23":
        differ = [(c, t, o) for c, t, o in zip(cases, theirs, ours, strict=True)
                  if (t == "llm") != (o == "llm")]
        assert differ == []
    assert theirs.count("diffusion") >= 15  # the cases do reach the diffusion path
