"""The test bed's one stand-in: vLLM's `rotary_embedding`, which SGLang's CPU path imports.

It must be present in the SGLang venv and compute a real rotation (never a silent no-op):
checked inside that venv against a rotation written out here.
"""

from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.e2e

CHECK = r"""
import torch
from vllm._custom_ops import rotary_embedding

torch.manual_seed(0)
tokens, heads, head = 5, 2, 8
pos = torch.arange(tokens)
inv = 1.0 / (10000 ** (torch.arange(0, head, 2).float() / head))
freqs = torch.outer(torch.arange(16).float(), inv)
cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
q = torch.randn(tokens, heads * head)
k = torch.randn(tokens, heads * head)

def reference(x):  # neox style: rotate the two halves
    x = x.view(tokens, heads, head)
    cos, sin = cache[pos].chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    a, b = x[..., : head // 2], x[..., head // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).reshape(tokens, -1)

want_q, want_k = reference(q.clone()), reference(k.clone())
rotary_embedding(pos, q, k, head, cache, True)
assert not torch.allclose(want_q, q.new_zeros(q.shape))
assert torch.allclose(q, want_q, atol=1e-5), "query not rotated like the reference"
assert torch.allclose(k, want_k, atol=1e-5), "key not rotated like the reference"
print("ok")
"""


def test_the_shim_is_installed_and_rotates_like_the_reference(sglang_python: str) -> None:
    out = subprocess.run([sglang_python, "-c", CHECK], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (
        "the vLLM shim in the SGLang test-bed venv is missing or wrong "
        f"(tests/e2e/shim/vllm/_custom_ops.py):\n{out.stderr[-1500:]}")
