"""What the guard knows about the model and the GPU: plain frozen values, no I/O."""

from __future__ import annotations

from dataclasses import field, fields
from typing import Literal

from sglang_guard.common.record import record

AttentionArch = Literal["mla", "mha", "ssm", "unknown"]
ATTENTION_ARCHS: tuple[AttentionArch, ...] = ("mla", "mha", "ssm", "unknown")


# The config.json fields a backend needs (configs/backends.toml, kind model_field):
# dual_chunk_flash_attn reads dual_chunk_attention_config, dsa needs index_topk (a DSA
# checkpoint: is_deepseek_dsa, configs/model_config.py).
CONFIG_FIELDS = ("dual_chunk_attention_config", "index_topk")


@record
class ModelShape:
    """The config.json numbers the size checks read (SGLang's hf_text_config), None when absent."""

    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    intermediate_size: int | None = None
    moe_intermediate_size: int | None = None
    first_k_dense_replace: int | None = None
    # SGLang's get_context_length(hf_text_config): the first context key, times the RoPE factor.
    context_length: int | None = None
    quant_method: str | None = None  # quantization_config.quant_method, lower-cased
    weight_block_size: tuple[int, int] | None = None  # quantization_config.weight_block_size
    # Which of CONFIG_FIELDS the config has, not null (backends that need one: the backend
    # table's model_field checks); None: not read.
    config_fields: tuple[str, ...] | None = None

    def as_dict(self) -> dict[str, object]:
        """The JSON shape (facts cache, `check --json`)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, object] | None) -> ModelShape | None:
        """The inverse of as_dict (None stays None)."""
        if data is None:
            return None
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}  # another guard's cache entry
        block = data.get("weight_block_size")
        present = data.get("config_fields")
        return cls(**{**data, "weight_block_size":  # type: ignore[arg-type]
                      tuple(block) if isinstance(block, list | tuple) else None,
                      "config_fields": tuple(present) if isinstance(present, list | tuple)
                      else None})


@record
class ModelFacts:
    """A model as SGLang would see it (after overrides and draft renames)."""

    path: str
    architectures: tuple[str, ...]
    attention_arch: AttentionArch
    model_type: str | None = None
    # Why the architecture is unknown (an unresolvable hub id, say); None when known.
    warning: str | None = None
    shape: ModelShape | None = None  # None: config.json was not read (size checks skipped)


@record
class GpuFacts:
    """The GPU's compute capability as an SM number (90 for 9.0), or None when unknown."""

    sm: int | None
    name: str | None = None
    # "nvml", "override" (--gpu-sm N), "none" (--gpu-sm none: no GPU on this host),
    # or "unknown" (the probe could not tell).
    source: Literal["nvml", "override", "none", "unknown"] = "unknown"
    warning: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def known(self) -> bool:
        """True when GPU-based checks can run."""
        return self.sm is not None


def with_warning(facts: ModelFacts, note: str | None) -> ModelFacts:
    """`facts` with `note` put before its own warning (unchanged when there is no note)."""
    if not note:
        return facts
    warning = f"{note}; {facts.warning}" if facts.warning else note
    return ModelFacts(facts.path, facts.architectures, facts.attention_arch, facts.model_type,
                      warning)
