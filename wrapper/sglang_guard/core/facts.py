"""What the guard knows about the model and the GPU: plain frozen values, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

AttentionArch = Literal["mla", "mha", "ssm", "unknown"]
ATTENTION_ARCHS: tuple[AttentionArch, ...] = ("mla", "mha", "ssm", "unknown")


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """A model as SGLang would see it (after overrides and draft renames)."""

    path: str
    architectures: tuple[str, ...]
    attention_arch: AttentionArch
    model_type: str | None = None
    # Why the architecture is unknown (an unresolvable hub id, say); None when known.
    warning: str | None = None


@dataclass(frozen=True, slots=True)
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
