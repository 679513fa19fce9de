"""Model facts from AutoConfig: local dirs, the offline hub cache, overrides, errors, the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.errors import InputError, ModelError
from sglang_guard.preflight.shell import modelprobe
from sglang_guard.preflight.shell.modelprobe import cache_dir, parse_overrides, resolve_model
from support.models import write_deepseek_v3, write_llama


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="session")
def deepseek(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_deepseek_v3(tmp_path_factory.mktemp("dsv3"))


def _write(d: Path, config: Any) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return d


def test_llama_is_mha(llama: Path) -> None:
    facts = resolve_model(str(llama), use_cache=False)
    assert (facts.architectures, facts.attention_arch, facts.model_type) == (
        ("LlamaForCausalLM",), "mha", "llama")
    assert facts.warning is None
    assert facts.path == str(llama)


def test_deepseek_v3_is_mla_and_its_draft_too(deepseek: Path) -> None:
    assert resolve_model(str(deepseek), use_cache=False).attention_arch == "mla"
    draft = resolve_model(str(deepseek), is_draft=True, use_cache=False)
    assert draft.architectures == ("DeepseekV3ForCausalLMNextN",)
    assert draft.attention_arch == "mla"


def test_kv_lora_rank_alone_is_not_mla(tmp_path: Path) -> None:
    d = write_llama(tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    cfg["kv_lora_rank"] = 512
    _write(d, cfg)
    assert resolve_model(str(d), use_cache=False).attention_arch == "mha"


def test_override_args_change_the_answer(llama: Path) -> None:
    over = json.dumps({"architectures": ["DeepseekV3ForCausalLM"]})
    facts = resolve_model(str(llama), override_args=over, use_cache=False)
    assert facts.architectures == ("DeepseekV3ForCausalLM",)
    assert facts.attention_arch == "mla"


def test_override_on_a_nested_text_config(tmp_path: Path) -> None:
    # Pixtral is MLA only when its *text* config has kv_lora_rank (model_config.py:1386).
    cfg = {"architectures": ["PixtralForConditionalGeneration"], "model_type": "unknown-x",
           "text_config": {"num_attention_heads": 4}}
    d = _write(tmp_path / "px", cfg)
    assert resolve_model(str(d), use_cache=False).attention_arch == "mha"
    over = json.dumps({"text_config": {"kv_lora_rank": 64}})
    assert resolve_model(str(d), override_args=over, use_cache=False).attention_arch == "mla"


@pytest.mark.parametrize(
    ("config", "arch"),
    [
        # thinker_config > llm_config > language_config > text_config
        ({"thinker_config": {"text_config": {"kv_lora_rank": 8}}, "text_config": {}}, "mla"),
        ({"thinker_config": {"kv_lora_rank": 8}, "text_config": {}}, "mla"),
        ({"llm_config": {"kv_lora_rank": 8}, "language_config": {}}, "mla"),
        ({"language_config": {"kv_lora_rank": 8}, "text_config": {}}, "mla"),
        ({"text_config": {"kv_lora_rank": 8}}, "mla"),
        ({"language_config": {}, "text_config": {"kv_lora_rank": 8}}, "mha"),
        # present but null: SGLang's hasattr() picks it, and falls back to the config itself
        ({"thinker_config": None, "text_config": {"kv_lora_rank": 8}}, "mha"),
        ({"kv_lora_rank": 8}, "mla"),
    ],
)
def test_text_config_priority(tmp_path: Path, config: dict[str, Any], arch: str) -> None:
    cfg = {"architectures": ["PixtralForConditionalGeneration"], "model_type": "unknown-x",
           **config}
    d = _write(tmp_path / "m", cfg)
    assert resolve_model(str(d), use_cache=False).attention_arch == arch


def test_unknown_model_type_reads_plain_fields_with_a_warning(tmp_path: Path) -> None:
    d = _write(tmp_path / "m", {"architectures": ["DeepseekV3ForCausalLM"],
                                "model_type": "no-such-type"})
    facts = resolve_model(str(d), use_cache=False)
    assert facts.attention_arch == "mla"
    assert facts.warning is not None and "AutoConfig could not load it" in facts.warning


def test_no_architectures_is_unknown(tmp_path: Path) -> None:
    d = _write(tmp_path / "m", {"model_type": "llama"})
    facts = resolve_model(str(d), use_cache=False)
    assert facts.attention_arch == "unknown"
    assert facts.warning


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "is not valid JSON (the file is empty)"),
        (b"   \n", "is not valid JSON (the file is empty)"),
        (b"{not json", "is not valid JSON"),
        (b"[1, 2]", "must hold a JSON object, not list"),
    ],
)
def test_bad_config_json(tmp_path: Path, content: bytes, needle: str) -> None:
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ModelError) as info:
        resolve_model(str(tmp_path))
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_paths(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model("./nope-here")
    with pytest.raises(ModelError, match=r"has no config\.json"):
        resolve_model(str(tmp_path))
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelError, match="is a file"):
        resolve_model(str(f))


def test_gguf_and_mistral_format_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert resolve_model(str(tmp_path / "m.gguf")).attention_arch == "unknown"
    assert resolve_model(str(tmp_path)).attention_arch == "unknown"
    mistral = tmp_path / "mistral"
    mistral.mkdir()
    (mistral / "params.json").write_text("{}", encoding="utf-8")
    facts = resolve_model(str(mistral))
    assert facts.attention_arch == "unknown"
    assert facts.warning is not None and "no config.json" in facts.warning


def test_unresolvable_hub_id_is_unknown_with_warning() -> None:
    facts = resolve_model("no-such-org/no-such-model")
    assert facts.attention_arch == "unknown"
    assert facts.warning is not None and "cannot resolve hub model" in facts.warning


def test_hub_id_from_the_offline_cache(tmp_path: Path, deepseek: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants  # noqa: PLC0415

    hub = tmp_path / "hub"
    repo = hub / "models--acme--tiny-dsv3"
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_bytes((deepseek / "config.json").read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40, encoding="utf-8")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    facts = resolve_model("acme/tiny-dsv3", use_cache=False)
    assert (facts.architectures, facts.attention_arch) == (("DeepseekV3ForCausalLM",), "mla")


def test_facts_cache(llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = resolve_model(str(llama))
    assert len(list(cache_dir().glob("*.json"))) == 1
    real = modelprobe._auto_config
    monkeypatch.setattr(modelprobe, "_auto_config",
                        lambda *a, **k: pytest.fail("cache missed"))
    assert resolve_model(str(llama)) == first
    # a different override, draft flag or trust flag is a different key
    monkeypatch.setattr(modelprobe, "_auto_config", real)
    resolve_model(str(llama), override_args='{"x": 1}')
    resolve_model(str(llama), is_draft=True)
    resolve_model(str(llama), trust_remote_code=True)
    assert len(list(cache_dir().glob("*.json"))) == 4


def test_cache_follows_config_bytes(tmp_path: Path) -> None:
    d = write_llama(tmp_path / "m")
    assert resolve_model(str(d)).attention_arch == "mha"
    cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    cfg["architectures"] = ["DeepseekV3ForCausalLM"]
    cfg["model_type"] = "not-known"
    _write(d, cfg)
    assert resolve_model(str(d)).attention_arch == "mla"


def test_corrupt_cache_entry_is_ignored(llama: Path) -> None:
    resolve_model(str(llama))
    for f in cache_dir().glob("*.json"):
        f.write_text("{oops", encoding="utf-8")
    assert resolve_model(str(llama)).attention_arch == "mha"


@pytest.mark.parametrize(
    ("text", "expected"),
    [(None, {}), ("", {}), ('{"a": 1}', {"a": 1})],
)
def test_parse_overrides(text: str | None, expected: dict[str, Any]) -> None:
    assert parse_overrides(text) == expected


@pytest.mark.parametrize(("text", "needle"), [("{", "not valid JSON"), ("[1]", "JSON object")])
def test_parse_overrides_errors(text: str, needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        parse_overrides(text)


def test_unreachable_hub_gives_unknown_quickly_and_quietly(tmp_path: Path) -> None:
    """Not offline, but the hub cannot be reached: one quick probe, no retry storm."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env |= {"HF_ENDPOINT": "http://127.0.0.1:1", "HF_HOME": str(tmp_path / "hf"),
            "SGLANG_GUARD_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-m", "sglang_guard", "check", "--json", "--",
                          "--model-path", "some-org/some-model"],
                         capture_output=True, text=True, env=env, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["model"]["attention_arch"] == "unknown"
    assert any("unreachable" in w for w in report["warnings"])
    assert "Retrying" not in out.stderr  # huggingface_hub's retry storm (~25 s) never starts
