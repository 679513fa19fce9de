"""`sglang-guard check`: exit statuses, JSON shape, redacted human output, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from sglang_guard.cli import main
from support.models import write_deepseek_v3, write_llama


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_llama(tmp_path_factory.mktemp("llama")))


@pytest.fixture(scope="module")
def dsv3(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_deepseek_v3(tmp_path_factory.mktemp("dsv3")))


def _check(*args: str) -> Result:
    return CliRunner().invoke(main, ["check", *args], catch_exceptions=False)


def _json(*args: str) -> tuple[int, dict[str, Any]]:
    res = _check("--json", *args)
    return res.exit_code, json.loads(res.stdout)


def _one_line_error(res: Result, needle: str) -> None:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("sglang-guard: error: ")
    assert needle in lines[0]
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    ("policy", "backend", "code", "verdict"),
    [
        ("drop", "fa3", 0, "ok"),
        ("drop", "flashmla", 1, "remediated"),
        ("rewrite", "flashmla", 1, "remediated"),
        ("fail", "flashmla", 78, "refused"),
        ("warn", "flashmla", 0, "ok"),
        ("drop", "no_such_backend", 1, "remediated"),
    ],
)
def test_exit_status_and_json(llama: str, policy: str, backend: str, code: int,
                              verdict: str) -> None:
    argv = ["--model-path", llama, "--attention-backend", backend, "--api-key", "s3cr3t"]
    rc, out = _json("--policy", policy, "--gpu-sm", "90", "--", *argv)
    assert (rc, out["verdict"]) == (code, verdict)
    assert out["argv_in"] == [*argv[:-1], "***"]  # masked as in the human output
    assert "s3cr3t" not in json.dumps(out)
    assert out["model"] == {"path": llama, "architectures": ["LlamaForCausalLM"],
                            "attention_arch": "mha", "model_type": "llama"}
    assert out["gpu"]["sm"] == 90
    assert out["derived_config"] is None
    for f in out["findings"]:
        assert {"flag", "value", "action", "new_value", "reason"} <= set(f)
    if policy == "rewrite":
        assert out["argv_out"][-4:-2] == ["--attention-backend", "fa3"]
        assert out["findings"][0]["new_value"] == "fa3"


def test_human_output_redacts(llama: str) -> None:
    res = _check("--gpu-sm", "90", "--", "--model-path", llama, "--attention-backend",
                 "flashmla", "--api-key=s3cr3t", "--admin-api-key", "adm1n")
    assert res.exit_code == 1
    assert "s3cr3t" not in res.output and "adm1n" not in res.output
    assert "--api-key=***" in res.stdout
    assert "verdict   remediated" in res.stdout
    assert "finding   --attention-backend flashmla: dropped" in res.stdout
    assert "attention: mha" in res.stdout


def test_human_warnings_redact_stray_tokens(llama: str) -> None:
    res = _check("--gpu-sm", "90", "--", "--model-path", llama, "hf_abcdefghijklmnop")
    assert "unrecognized arguments" in res.stdout
    assert "hf_abcdefghijklmnop" not in res.stdout


def test_yaml_flag_gives_derived_config(dsv3: str, tmp_path: Path) -> None:
    user = tmp_path / "s.yaml"
    user.write_text(yaml.safe_dump({"attention-backend": "trtllm_mha", "port": 30001}),
                    encoding="utf-8")
    state = tmp_path / "state"
    rc, out = _json("--gpu-sm", "90", "--state-dir", str(state), "--",
                    "--model-path", dsv3, "--config", str(user))
    assert rc == 1
    assert out["model"]["attention_arch"] == "mla"
    assert out["derived_config"] == {"port": 30001}
    path = out["derived_config_path"]
    assert path.startswith(str(state / "derived"))
    assert out["argv_out"] == ["--model-path", dsv3, "--config", path]
    assert yaml.safe_load(user.read_text(encoding="utf-8"))["attention-backend"] == "trtllm_mha"
    # the same check again names the same derived file
    assert _json("--gpu-sm", "90", "--state-dir", str(state), "--", "--model-path", dsv3,
                 "--config", str(user))[1]["derived_config_path"] == path


def test_guard_config_policy_and_rewrite_map(llama: str, tmp_path: Path) -> None:
    cfg = tmp_path / "g.toml"
    cfg.write_text('gpu = { sm = 90 }\n[policy]\ndefault = "rewrite"\n'
                   '[policy.rewrite]\n"--attention-backend" = "triton"\n', encoding="utf-8")
    rc, out = _json("--config", str(cfg), "--", "--model-path", llama,
                    "--attention-backend", "flashmla")
    assert rc == 1
    assert out["argv_out"] == ["--model-path", llama, "--attention-backend", "triton"]
    # --policy on the command line beats the file
    rc, _ = _json("--config", str(cfg), "--policy", "fail", "--", "--model-path", llama,
                  "--attention-backend", "flashmla")
    assert rc == 78


def test_args_from_guard_config(llama: str, tmp_path: Path) -> None:
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[sglang]\nargs = ["--model-path", "{llama}"]\n', encoding="utf-8")
    rc, out = _json("--config", str(cfg), "--gpu-sm", "none")
    assert (rc, out["argv_in"], out["gpu"]["source"]) == (0, ["--model-path", llama], "none")


def test_unknown_model_is_not_an_error() -> None:
    rc, out = _json("--gpu-sm", "90", "--", "--model-path", "acme/not-cached",
                    "--attention-backend", "flashmla")
    assert rc == 0
    assert out["model"]["attention_arch"] == "unknown"
    assert any("cannot resolve hub model" in w for w in out["warnings"])


def test_bad_inputs_give_one_line(tmp_path: Path, llama: str) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("", encoding="utf-8")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text("{", encoding="utf-8")
    toml = tmp_path / "bad.toml"
    toml.write_text("[policy]\ndefault = 'nuke'\n", encoding="utf-8")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("a: [1,\n", encoding="utf-8")
    list_yaml = tmp_path / "list.yaml"
    list_yaml.write_text("- 1\n", encoding="utf-8")
    unsupported = tmp_path / "u.yaml"
    unsupported.write_text("enable-tf32-matmul: true\n", encoding="utf-8")
    cases = [
        (["--", "--model-path", str(tmp_path / "nope")], "does not exist"),
        (["--", "--model-path", str(empty)], "the file is empty"),
        (["--", "--model-path", str(corrupt)], "is not valid JSON"),
        (["--", "--model-path", str(tmp_path)], "has no config.json"),
        (["--", "--port", "1"], "no --model-path"),
        (["--config", str(toml), "--", "--model-path", llama], "policy.default"),
        (["--config", str(tmp_path / "none.toml"), "--", "--model-path", llama],
         "file not found"),
        (["--", "--model-path", llama, "--config", str(bad_yaml)], "not valid YAML"),
        (["--", "--model-path", llama, "--config", str(list_yaml)], "mapping"),
        (["--", "--model-path", llama, "--config", str(tmp_path / "gone.yaml")],
         "file not found"),
        (["--", "--model-path", llama, "--config", str(unsupported)], "cannot take"),
        (["--", "--model-path", llama, "--config"], "needs a YAML file"),
        (["--", "--model-path", llama, "--config", "x.json"], ".yaml/.yml"),
        (["--gpu-sm", "hopper", "--", "--model-path", llama], "--gpu-sm"),
        (["--", "--model-path", llama, "--json-model-override-args", "{"], "not valid JSON"),
    ]
    for args, needle in cases:
        _one_line_error(_check(*args), needle)


def test_no_args_is_usage_error() -> None:
    res = _check()
    assert res.exit_code == 2
    assert "no SGLang arguments" in res.output


def test_bad_policy_is_usage_error(llama: str) -> None:
    res = _check("--policy", "nuke", "--", "--model-path", llama)
    assert res.exit_code == 2
