"""Write the conformance run's model directories (config.json only) with transformers' classes.

    python tools/h200/make_models.py tests/data/h200-models

Real checkpoints' shapes (heads, KV heads, MLP widths, context, quantization_config), so the
TP, FP8-block and context-length arithmetic is the arithmetic a user meets. No weights.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

FP8_BLOCK = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
             "weight_block_size": [128, 128]}


def _config(cls: Callable[..., PreTrainedConfig], **fields: object) -> PreTrainedConfig:
    """`cls(**fields)`. The keys a published config.json carries beyond the class's typed
    signature (rope_theta, rope_scaling, torch_dtype, quantization_config, head_dim on some)
    are taken by its __init__ and kept as attributes; transformers' dataclass_transform
    signature does not list them, so the call is typed against a plain callable."""
    return cls(**fields)


def _models() -> dict[str, PreTrainedConfig]:
    from transformers import (
        DeepseekV3Config,
        GptOssConfig,
        LlamaConfig,
        Qwen2Config,
        Qwen3MoeConfig,
    )

    return {
        # Llama-3.1-8B-Instruct's shape.
        "llama3-8b": _config(
            LlamaConfig, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
            num_key_value_heads=8, num_hidden_layers=32, max_position_embeddings=131072,
            vocab_size=128256, rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            architectures=["LlamaForCausalLM"], torch_dtype="bfloat16"),
        # Qwen2.5-7B-Instruct's shape with a block-FP8 quantization_config.
        "qwen2.5-7b-fp8-block": _config(
            Qwen2Config, hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
            num_key_value_heads=4, num_hidden_layers=28, max_position_embeddings=32768,
            vocab_size=152064, architectures=["Qwen2ForCausalLM"], torch_dtype="bfloat16",
            quantization_config=dict(FP8_BLOCK)),
        # DeepSeek-V3's shape (MLA, block FP8 as published).
        "deepseek-v3-fp8": _config(
            DeepseekV3Config, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
            num_attention_heads=128, num_key_value_heads=128, num_hidden_layers=61,
            first_k_dense_replace=3, n_routed_experts=256, n_shared_experts=1,
            num_experts_per_tok=8, n_group=8, topk_group=4, kv_lora_rank=512,
            q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
            max_position_embeddings=163840, vocab_size=129280,
            rope_scaling={"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                          "mscale": 1.0, "mscale_all_dim": 1.0,
                          "original_max_position_embeddings": 4096},
            architectures=["DeepseekV3ForCausalLM"], torch_dtype="bfloat16",
            quantization_config=dict(FP8_BLOCK)),
        # Qwen3-30B-A3B-FP8's shape.
        "qwen3-30b-a3b-fp8": _config(
            Qwen3MoeConfig, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
            num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_hidden_layers=48,
            num_experts=128, num_experts_per_tok=8, max_position_embeddings=40960,
            vocab_size=151936, architectures=["Qwen3MoeForCausalLM"], torch_dtype="bfloat16",
            quantization_config=dict(FP8_BLOCK)),
        # Qwen3-30B-A3B (bf16).
        "qwen3-30b-a3b": _config(
            Qwen3MoeConfig, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
            num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_hidden_layers=48,
            num_experts=128, num_experts_per_tok=8, max_position_embeddings=40960,
            vocab_size=151936, architectures=["Qwen3MoeForCausalLM"], torch_dtype="bfloat16"),
        # gpt-oss-20b's shape (MXFP4 experts as published).
        "gpt-oss-20b": _config(
            GptOssConfig, hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
            num_key_value_heads=8, head_dim=64, num_hidden_layers=24, num_local_experts=32,
            num_experts_per_tok=4, max_position_embeddings=131072, vocab_size=201088,
            sliding_window=128, architectures=["GptOssForCausalLM"], torch_dtype="bfloat16",
            quantization_config={"quant_method": "mxfp4",
                                 "modules_to_not_convert": ["model.layers.*.self_attn",
                                                            "model.layers.*.mlp.router",
                                                            "model.embed_tokens", "lm_head"]}),
    }


def main() -> None:
    """Write each model's config.json under the directory given."""
    root = Path(sys.argv[1])
    for name, cfg in _models().items():
        (root / name).mkdir(parents=True, exist_ok=True)
        cfg.save_pretrained(root / name)
        print(name)


if __name__ == "__main__":
    main()
