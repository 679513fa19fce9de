"""Tiny model directories (config.json only), written with the same transformers SGLang uses."""

from __future__ import annotations

from pathlib import Path


def write_llama(directory: Path, **overrides: object) -> Path:
    """A tiny Llama model directory (config.json only)."""
    from transformers import LlamaConfig  # noqa: PLC0415 - slow import, only where needed

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                      architectures=["LlamaForCausalLM"], **overrides)
    cfg.save_pretrained(directory)
    return directory


def write_deepseek_v3(directory: Path, **overrides: object) -> Path:
    """A tiny DeepSeek-V3 (MLA) model directory (config.json only)."""
    from transformers import DeepseekV3Config  # noqa: PLC0415

    cfg = DeepseekV3Config(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                           vocab_size=128, kv_lora_rank=16, q_lora_rank=None,
                           qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                           n_routed_experts=4, num_experts_per_tok=2,
                           architectures=["DeepseekV3ForCausalLM"], **overrides)
    cfg.save_pretrained(directory)
    return directory

