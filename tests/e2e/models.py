"""Tiny model directories (config.json only) across the families SGLang 0.5.23 serves.

Written with transformers' own config classes (the guard's python has transformers 5.19.0,
SGLang's pin), so the files look like the ones `save_pretrained` puts on the hub. Two model
types that transformers does not know (`kimi_vl`, `deepseek_vl_v2`: SGLang registers its own
classes for them in `srt/utils/hf_transformers/common.py`) are written as plain dicts.

`expect` is the attention_arch SGLang 0.5.23 gives each entry (read in
`srt/configs/model_config.py::_derive_model_shapes`); the oracle test keeps it honest.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import transformers

# The shapes every tiny model shares: small enough to load in seconds on 2 CPU cores.
SMALL: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
}
# SGLang's CPU rope path asserts unless a DeepSeek-family model uses yarn scaling.
YARN: dict[str, Any] = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 512,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "rope_theta": 10000.0,
}
MLA_SHAPES: dict[str, Any] = {
    "kv_lora_rank": 32,
    "q_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 16,
    "v_head_dim": 16,
}
MOE: dict[str, Any] = {"moe_intermediate_size": 32, "n_routed_experts": 4,
                       "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1}

Writer = Callable[[Path], None]


@dataclass(frozen=True, slots=True)
class TinyModel:
    """One model config to write, and how SGLang is to read it."""

    name: str
    writer: Writer
    expect: str  # SGLang 0.5.23's attention_arch: "mla" | "mha" | "ssm"
    is_draft: bool = False
    override_args: str | None = None  # --json-model-override-args


def _save(model_type: str, arch: str, **fields: Any) -> Writer:
    """A writer saving transformers' config class for `model_type`, `architectures=[arch]`."""

    def write(path: Path) -> None:
        config = transformers.AutoConfig.for_model(model_type, **fields)
        config.architectures = [arch]
        config.save_pretrained(str(path))

    return write


def _raw(config: dict[str, Any]) -> Writer:
    """A writer for a config.json that transformers' AutoConfig does not know."""

    def write(path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    return write


def _patched(writer: Writer, **extra: Any) -> Writer:
    """A writer that adds fields to config.json that the transformers class would drop."""

    def write(path: Path) -> None:
        writer(path)
        config_path = path / "config.json"
        config = json.loads(config_path.read_text())
        config.update(extra)
        config_path.write_text(json.dumps(config, indent=2) + "\n")

    return write


def _deepseek(model_type: str, arch: str, **extra: Any) -> Writer:
    # SGLang's DeepSeek model code reads these three (real V3 checkpoints carry them);
    # transformers' DeepseekV3Config does not keep them, so they are added to the file.
    return _patched(_save(model_type, arch, **SMALL, **MLA_SHAPES, **MOE,
                          first_k_dense_replace=1, rope_scaling=dict(YARN), **extra),
                    moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid")


def _deepseek_v2_text(**extra: Any) -> dict[str, Any]:
    """A DeepSeek-V2 text config as a plain dict (the language model of VL checkpoints)."""
    return {"model_type": "deepseek_v2", **SMALL, **MLA_SHAPES, **MOE,
            "first_k_dense_replace": 1, "rope_scaling": dict(YARN), **extra}


def _pixtral(with_kv_lora_rank: bool) -> Writer:
    """Pixtral as SGLang names it: a Llava-style config whose text part may carry MLA fields."""
    text: dict[str, Any] = {"model_type": "mistral", **SMALL, "head_dim": 16}
    if with_kv_lora_rank:
        text |= MLA_SHAPES | {"rope_scaling": dict(YARN)}
    return _save("llava", "PixtralForConditionalGeneration", text_config=text,
                 vision_config={"model_type": "pixtral", "hidden_size": 64,
                                "intermediate_size": 128, "num_hidden_layers": 1,
                                "num_attention_heads": 4, "image_size": 64, "patch_size": 16})


_DSV2 = ("deepseek_v2", "DeepseekV2ForCausalLM")
_DSV3 = ("deepseek_v3", "DeepseekV3ForCausalLM")
_DSV32 = ("deepseek_v32", "DeepseekV32ForCausalLM")
_GLM_MOE = _save("glm4_moe", "Glm4MoeForCausalLM", **SMALL, head_dim=16,
                 moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                 first_k_dense_replace=1)
_GLM_LITE = _save("glm4_moe_lite", "Glm4MoeLiteForCausalLM", **SMALL, **MLA_SHAPES,
                  moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                  first_k_dense_replace=1, rope_scaling=dict(YARN))
_GLM_DSA = _save("glm_moe_dsa", "GlmMoeDsaForCausalLM", **SMALL, **MLA_SHAPES,
                 moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                 first_k_dense_replace=1, rope_scaling=dict(YARN))
# No yarn here: SGLang's own LongcatFlashConfig validates yarn before it sets
# max_position_embeddings (srt/configs/longcat_flash.py:64-79) and fails to load.
_LONGCAT = _save("longcat_flash", "LongcatFlashForCausalLM", hidden_size=64,
                 num_layers=2, num_attention_heads=4, vocab_size=512, ffn_hidden_size=128,
                 max_position_embeddings=2048,
                 expert_ffn_hidden_size=32, n_routed_experts=4, **MLA_SHAPES)
_QWEN3_NEXT = _save("qwen3_next", "Qwen3NextForCausalLM", **SMALL, head_dim=16,
                    moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                    linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=16, linear_value_head_dim=16,
                    layer_types=["linear_attention", "full_attention"])
_DSV4 = _save("deepseek_v4", "DeepseekV4ForCausalLM", hidden_size=64, num_hidden_layers=2,
              num_attention_heads=4, head_dim=64, qk_rope_head_dim=16, q_lora_rank=32,
              o_lora_rank=32, o_groups=2, index_n_heads=4, index_head_dim=16, index_topk=8,
              moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
              vocab_size=512, max_position_embeddings=2048, sliding_window=16,
              layer_types=["compressed_sparse_attention", "heavily_compressed_attention"],
              mlp_layer_types=["hash_moe", "moe"])
# SGLang reads V4 through a DeepseekV3Config alias that wants the checkpoint's own field
# (transformers' V4 class calls it compress_rates and drops compress_ratios on save).
_DSV4 = _patched(_DSV4, compress_ratios=[4, 128])
_LLAMA = _save("llama", "LlamaForCausalLM", **SMALL)
_DSV3_W = _deepseek(*_DSV3)
_VL2_BASE: dict[str, Any] = {"model_type": "deepseek_vl_v2",
                             "architectures": ["DeepseekVL2ForCausalLM"]}

MODELS: tuple[TinyModel, ...] = (
    TinyModel("llama", _LLAMA, "mha"),
    # A stray MLA-looking field does not make a Llama MLA: SGLang decides by architecture.
    TinyModel("llama-kv-lora-rank", _save("llama", "LlamaForCausalLM", **SMALL,
                                          kv_lora_rank=32), "mha"),
    TinyModel("llama-draft", _LLAMA, "mha", is_draft=True),
    TinyModel("deepseek-v2", _deepseek(*_DSV2), "mla"),
    # V2 has no NextN rename; a V2 draft keeps its (MLA) architecture.
    TinyModel("deepseek-v2-draft", _deepseek(*_DSV2), "mla", is_draft=True),
    TinyModel("deepseek-v3", _DSV3_W, "mla"),
    TinyModel("deepseek-v3-nextn", _DSV3_W, "mla", is_draft=True),
    TinyModel("deepseek-v32", _deepseek(*_DSV32), "mla"),
    TinyModel("deepseek-v32-nextn", _deepseek(*_DSV32), "mla", is_draft=True),
    # An override can rename the architecture out of the MLA list.
    TinyModel("deepseek-v3-as-llama", _DSV3_W, "mha",
              override_args='{"architectures": ["LlamaForCausalLM"]}'),
    # DeepSeek-V4 left the MLA list: SGLang runs it (and its NextN draft) as MHA.
    TinyModel("deepseek-v4", _DSV4, "mha"),
    TinyModel("deepseek-v4-nextn", _DSV4, "mha", is_draft=True),
    TinyModel("glm4-moe", _GLM_MOE, "mha"),
    # The GLM-4 MoE NextN draft is MHA although DeepSeek-style drafts are MLA.
    TinyModel("glm4-moe-nextn", _GLM_MOE, "mha", is_draft=True),
    TinyModel("glm4-moe-lite", _GLM_LITE, "mla"),
    TinyModel("glm4-moe-lite-nextn", _GLM_LITE, "mla", is_draft=True),
    TinyModel("glm-moe-dsa", _GLM_DSA, "mla"),
    TinyModel("glm-moe-dsa-nextn", _GLM_DSA, "mla", is_draft=True),
    TinyModel("kimi-vl", _raw({"model_type": "kimi_vl",
                               "architectures": ["KimiVLForConditionalGeneration"],
                               "text_config": _deepseek_v2_text(),
                               "vision_config": {"hidden_size": 64, "num_hidden_layers": 1,
                                                 "num_attention_heads": 4}}), "mla"),
    TinyModel("kimi-linear", _save("kimi_linear", "KimiLinearForCausalLM", **SMALL,
                                   **MLA_SHAPES, rope_scaling=dict(YARN)), "mla"),
    TinyModel("kimi-k25", _save("kimi_k25", "KimiK25ForConditionalGeneration",
                                text_config=_deepseek_v2_text(model_type="deepseek_v3")),
              "mla"),
    TinyModel("longcat-flash", _LONGCAT, "mla"),
    TinyModel("longcat-flash-nextn", _LONGCAT, "mla", is_draft=True),
    TinyModel("minicpm3", _save("minicpm3", "MiniCPM3ForCausalLM", **SMALL,
                                **MLA_SHAPES), "mla"),
    TinyModel("qwen2", _save("qwen2", "Qwen2ForCausalLM", **SMALL), "mha"),
    TinyModel("qwen3", _save("qwen3", "Qwen3ForCausalLM", **SMALL, head_dim=16), "mha"),
    TinyModel("qwen3-next", _QWEN3_NEXT, "mha"),
    TinyModel("qwen3-next-mtp", _QWEN3_NEXT, "mha", is_draft=True),
    TinyModel("mistral", _save("mistral", "MistralForCausalLM", **SMALL), "mha"),
    TinyModel("mixtral", _save("mixtral", "MixtralForCausalLM", **SMALL,
                               num_local_experts=4, num_experts_per_tok=2), "mha"),
    TinyModel("gemma", _save("gemma", "GemmaForCausalLM", **SMALL, head_dim=16), "mha"),
    TinyModel("gpt-oss", _save("gpt_oss", "GptOssForCausalLM", **SMALL, head_dim=16,
                               num_local_experts=4, num_experts_per_tok=2), "mha"),
    TinyModel("mamba", _save("mamba", "MambaForCausalLM", hidden_size=64,
                             num_hidden_layers=2, vocab_size=512, state_size=8), "ssm"),
    TinyModel("mamba2", _save("mamba2", "Mamba2ForCausalLM", hidden_size=64,
                              num_hidden_layers=2, vocab_size=512, num_heads=8, head_dim=16,
                              state_size=8, n_groups=1), "ssm"),
    TinyModel("falcon-mamba", _save("falcon_mamba", "FalconMambaForCausalLM",
                                    hidden_size=64, num_hidden_layers=2, vocab_size=512,
                                    state_size=8), "ssm"),
    TinyModel("deepseek-vl2", _raw(_VL2_BASE | {"language_config": _deepseek_v2_text()}),
              "mla"),
    TinyModel("deepseek-vl2-no-mla",
              _raw(_VL2_BASE | {"language_config": _deepseek_v2_text(use_mla=False)}), "mha"),
    # The same switch, thrown from the command line instead of config.json.
    TinyModel("deepseek-vl2-override-no-mla",
              _raw(_VL2_BASE | {"language_config": _deepseek_v2_text()}), "mha",
              override_args='{"language_config": {"use_mla": false}}'),
    TinyModel("pixtral", _pixtral(with_kv_lora_rank=False), "mha"),
    TinyModel("pixtral-kv-lora-rank", _pixtral(with_kv_lora_rank=True), "mla"),
)


def write_all(root: Path) -> dict[str, Path]:
    """Write every model in MODELS under `root`; returns name -> directory."""
    dirs = {}
    for model in MODELS:
        path = root / model.name
        model.writer(path)
        dirs[model.name] = path
    return dirs


def write_tiny_llama(path: Path) -> Path:
    """A Llama that serves /generate on CPU (the happy-path server model)."""
    _LLAMA(path)
    return path


def write_tiny_deepseek_v3(path: Path) -> Path:
    """A DeepSeek-V3 (MLA) that starts on CPU; its first forward pass fails there."""
    _DSV3_W(path)
    return path
