"""`trust_remote_code` exactly as SGLang 0.5.23 decides it (sglang/argv.py::remote_code_trust).

The model's `configuration_marker.py` writes a marker file when it is executed: the guard
must run it only for a command line SGLang's parser accepts with the flag stored True.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sglang_guard.cli import main

CODE = '''
from pathlib import Path
from transformers import PretrainedConfig

Path({marker!r}).write_text("remote code ran")


class MarkerConfig(PretrainedConfig):
    model_type = "marker_model"
'''


@pytest.fixture
def remote_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A model dir whose config needs its own code (auto_map), and the marker it would write."""
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    monkeypatch.setenv("SGLANG_GUARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = tmp_path / "model"
    model.mkdir()
    marker = tmp_path / "MARKER"
    (model / "configuration_marker.py").write_text(CODE.format(marker=str(marker)))
    (model / "config.json").write_text(json.dumps({
        "architectures": ["MarkerForCausalLM"], "model_type": "marker_model",
        "auto_map": {"AutoConfig": "configuration_marker.MarkerConfig"},
        "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1}))
    return model, marker


def _check(tmp_path: Path, *sglang: str) -> dict[str, object]:
    res = CliRunner().invoke(main, ["check", "--json", "--gpu-sm", "none",
                                    "--state-dir", str(tmp_path / "state"), "--", *sglang])
    assert res.exit_code in (0, 1, 2), res.output
    out: dict[str, object] = json.loads(res.stdout)
    # 2: the release's parser rejects the line (issue 19): `check` says so, `run` never runs it
    assert (res.exit_code == 2) == (out["verdict"] == "rejected"), out
    return out


def test_the_valid_flag_runs_the_models_code(tmp_path: Path, remote_model: tuple[Path, Path]
                                             ) -> None:
    model, marker = remote_model
    _check(tmp_path, "--model-path", str(model), "--trust-remote-code")
    assert marker.exists()  # the control: the marker does detect executed remote code


@pytest.mark.parametrize("form", [
    ["--trust-remote-code=no"],          # argparse: ignored explicit argument 'no'
    ["--trust-remote-code=1"],
    ["--trust-remote-code", "false"],    # unrecognized arguments: false
    ["--trust-remote-code", "--no-such-flag"],
    ["--trust-remote-code", "--", "x"],
])
def test_a_form_sglang_rejects_never_runs_it(tmp_path: Path, remote_model: tuple[Path, Path],
                                             form: list[str]) -> None:
    model, marker = remote_model
    out = _check(tmp_path, "--model-path", str(model), *form)
    assert not marker.exists(), "the guard ran remote code SGLang would not run"
    assert out["verdict"] == "rejected"
    assert out["model"]["attention_arch"] == "unknown"  # type: ignore[index]
    assert any("is not honoured" in w for w in out["warnings"]), out["warnings"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", ['"false"', '"true"', '"no"', "1", "[true]"])
def test_a_yaml_value_that_is_not_a_boolean_never_runs_it(
        tmp_path: Path, remote_model: tuple[Path, Path], value: str) -> None:
    # ConfigArgumentMerger passes a non-bool as `--trust-remote-code <value>`: SGLang exits 2
    model, marker = remote_model
    yaml_file = tmp_path / "sglang.yaml"
    yaml_file.write_text(f"model-path: {model}\ntrust-remote-code: {value}\n")
    out = _check(tmp_path, "--config", str(yaml_file))
    assert not marker.exists(), "the guard ran remote code SGLang would not run"
    assert any("is not honoured" in w for w in out["warnings"]), out["warnings"]  # type: ignore[attr-defined]


def test_a_yaml_true_runs_it(tmp_path: Path, remote_model: tuple[Path, Path]) -> None:
    model, marker = remote_model
    yaml_file = tmp_path / "sglang.yaml"
    yaml_file.write_text(f"model-path: {model}\ntrust-remote-code: true\n")
    _check(tmp_path, "--config", str(yaml_file))
    assert marker.exists()
