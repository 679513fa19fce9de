"""Which `sglang serve` command lines are not the LLM server's (sglang/shell/servebackend.py),
read as SGLang 0.5.23's serve.py reads them; tests/e2e/test_conformance_serve.py holds the
same cases to the real release's own detector."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from huggingface_hub import constants

from sglang_guard.sglang.launcher import model_path_of, selected_backend, split_args
from sglang_guard.sglang.shell.servebackend import backend


def _dir(tmp_path: Path, name: str, files: dict[str, object]) -> str:
    d = tmp_path / name
    d.mkdir()
    for fname, body in files.items():
        (d / fname).write_text(body if isinstance(body, str) else json.dumps(body))
    return str(d)


def _why(args: list[str]) -> str | None:
    return backend(*split_args(args))


def test_a_diffusers_pipeline_directory_is_not_the_llm_servers(tmp_path: Path) -> None:
    pipe = _dir(tmp_path, "pipe", {"model_index.json": {"_diffusers_version": "0.30.0"}})
    modular = _dir(tmp_path, "modular",
                   {"modular_model_index.json": {"_diffusers_version": "0.35.0"}})
    # SGLang's test is `"_diffusers_version" in json.load(f)`, whatever the JSON holds
    listed = _dir(tmp_path, "listed", {"model_index.json": ["_diffusers_version"]})
    for args in ([pipe], [listed], ["--model-path", pipe], [f"--model-path={pipe}"],
                 ["--model", pipe], [modular, "--num-gpus", "1"], [pipe, "--model-type", "auto"]):
        assert _why(args) is not None, args
    assert "diffusers pipeline" in (_why([pipe]) or "")


def test_an_llm_directory_and_look_alikes_stay_with_the_guard(tmp_path: Path) -> None:
    llm = _dir(tmp_path, "llm", {"config.json": {"architectures": ["LlamaForCausalLM"]}})
    no_key = _dir(tmp_path, "nokey", {"model_index.json": {"_class_name": "X"}})
    broken = _dir(tmp_path, "broken", {"model_index.json": "{not json"})
    numeric = _dir(tmp_path, "numeric", {"model_index.json": "7"})
    # the first index that exists decides (utils.py:72-76), even where the second would say yes
    first = _dir(tmp_path, "first", {"model_index.json": {"x": 1},
                                     "modular_model_index.json": {"_diffusers_version": "1"}})
    pipe = _dir(tmp_path, "pipe", {"model_index.json": {"_diffusers_version": "0.30.0"}})
    for args in ([llm], [no_key], [broken], [numeric], [first], ["--port", "1"],
                 [pipe, "--model-type", "llm"], ["--model-type=llm", pipe],
                 [str(tmp_path / "missing")]):
        assert _why(args) is None, args


def test_a_selected_backend_other_than_llm_is_not_judged(tmp_path: Path) -> None:
    llm = _dir(tmp_path, "llm", {"config.json": {}})
    assert _why([llm, "--model-type", "diffusion"]) == (
        "--model-type diffusion selects SGLang's diffusion backend")
    assert _why([llm, "--model-type=my_plugin"]) is not None  # an installed out-of-tree one
    assert _why([llm, "--pipeline-class-name", "FluxPipeline"]) is not None


@pytest.mark.parametrize(("own", "chosen"), [
    ((), "auto"), (("--model-type", "llm"), "llm"), (("--model-type=diffusion",), "diffusion"),
    (("--model-type", "llm", "--model-type", "diffusion"), "diffusion"),
])
def test_selected_backend_reads_the_last_selector(own: tuple[str, ...], chosen: str) -> None:
    assert selected_backend(own) == chosen


def test_model_path_of_reads_the_first_spelling_as_sglang_does() -> None:
    assert model_path_of(["--port", "1", "--model", "a", "--model-path", "b"]) == "a"
    assert model_path_of(["--model-path=c"]) == "c"
    assert model_path_of(["--model-path"]) is None
    assert model_path_of(["--model-paths", "x"]) is None


def _hub_cache(root: Path, repo: str, index: object) -> Path:
    """A Hugging Face hub cache holding `repo`'s model_index.json (its on-disk layout)."""
    base = root / f"models--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text("0" * 40)
    snap = base / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (snap / "model_index.json").write_text(json.dumps(index))
    return root


def test_a_hub_pipeline_is_read_from_the_cache_or_the_hub(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _hub_cache(tmp_path / "hub", "org/pipe", {"_diffusers_version": "0.31.0"})
    _hub_cache(cache, "org/llm-ish", {"_class_name": "x"})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "on the hub" in (_why(["org/pipe", "--num-gpus", "1"]) or "")
    assert _why(["org/llm-ish"]) is None
    assert _why(["org/not-cached"]) is None  # offline: SGLang's fetch fails too -> llm
    # online but the hub unreachable: one quick refused connection, then the LLM path
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    assert _why(["org/not-cached"]) is None
