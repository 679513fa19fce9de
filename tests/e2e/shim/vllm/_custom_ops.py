"""A real (pure torch) `rotary_embedding`, the one vLLM op SGLang's CPU path imports.

Installed only into the test-bed virtual environment (see tests/e2e/setup-sglang-cpu). It
computes the rotation in place, the way vLLM's CUDA kernel does, so a call gives right
answers instead of silently doing nothing.
"""

from __future__ import annotations

import torch


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """Rotate `query` and `key` in place by the cached cos/sin at `positions`."""
    flat_pos = positions.flatten()
    cos_sin = cos_sin_cache.index_select(0, flat_pos)
    cos, sin = cos_sin.chunk(2, dim=-1)
    rot_dim = cos.shape[-1] * 2

    def _rotate(x: torch.Tensor) -> None:
        shape = x.shape
        x3 = x.view(flat_pos.shape[0], -1, head_size)
        rot = x3[..., :rot_dim]
        c = cos.unsqueeze(1).to(x3.dtype)
        s = sin.unsqueeze(1).to(x3.dtype)
        if is_neox:
            x1, x2 = rot.chunk(2, dim=-1)
            out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
        else:
            x1 = rot[..., ::2]
            x2 = rot[..., 1::2]
            out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
        x3[..., :rot_dim] = out
        x.copy_(x3.view(shape))

    _rotate(query)
    if key is not None:
        _rotate(key)
