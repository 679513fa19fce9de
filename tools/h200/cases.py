"""The conformance run's command lines: models x backend flags x values, and the size checks.

    python tools/h200/cases.py > .h200/cases.jsonl

Deterministic: the same list every time, each line with a stable id.
"""

from __future__ import annotations

import json
import sys

sys.path.insert(0, "wrapper")

MODELS = ("llama3-8b", "qwen2.5-7b-fp8-block", "deepseek-v3-fp8", "qwen3-30b-a3b-fp8",
          "qwen3-30b-a3b", "gpt-oss-20b")
CONTEXT = {"llama3-8b": 131072, "qwen2.5-7b-fp8-block": 32768, "deepseek-v3-fp8": 163840,
           "qwen3-30b-a3b-fp8": 40960, "qwen3-30b-a3b": 40960, "gpt-oss-20b": 131072}
QUANT = ("fp8", "awq", "gptq", "modelopt_fp4", "w8a8_fp8", "mxfp4", "bitsandbytes")
SPLIT_MODELS = ("llama3-8b", "deepseek-v3-fp8")
KV_BACKENDS = ("fa3", "flashinfer", "triton", "trtllm_mha", "flashmla", "trtllm_mla",
               "cutedsl_mla", "fa4")


def _backends() -> tuple[str, ...]:
    from sglang_guard.preflight.compat import load_default_table

    return tuple(load_default_table().names)


def _cases() -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []

    def add(name: str, model: str, *args: str) -> None:
        out.append((f"{model}|{name}", ["--model-path", "{models}/" + model, *args]))

    backends = _backends()
    for m in MODELS:
        add("plain", m)
        for b in backends:
            add(f"attention-backend={b}", m, "--attention-backend", b)
    for m in SPLIT_MODELS:
        for b in backends:
            add(f"prefill-attention-backend={b}", m, "--prefill-attention-backend", b)
            add(f"decode-attention-backend={b}", m, "--decode-attention-backend", b)
        for b in KV_BACKENDS:
            for kv in ("fp8_e4m3", "fp8_e5m2"):
                add(f"attention-backend={b},kv-cache-dtype={kv}", m,
                    "--attention-backend", b, "--kv-cache-dtype", kv)
    for m in MODELS:
        n = CONTEXT[m]
        for c in (n // 2, n, n + 1, 2 * n):
            add(f"context-length={c}", m, "--context-length", str(c))
        for q in QUANT:
            add(f"quantization={q}", m, "--quantization", q)
        for tp in (2, 4, 8, 16, 32):
            add(f"tp={tp}", m, "--tp", str(tp))
        add("tp=8,moe-dense-tp-size=2", m, "--tp", "8", "--moe-dense-tp-size", "2")
        add("tp=8,moe-dense-tp-size=1", m, "--tp", "8", "--moe-dense-tp-size", "1")
        add("tp=32,moe-dense-tp-size=1", m, "--tp", "32", "--moe-dense-tp-size", "1")
        add("tp=3,nnodes=2", m, "--tp", "3", "--nnodes", "2")
    for b in ("flashmla", "trtllm_mla", "cutedsl_mla", "trtllm_mha", "fa3", "triton"):
        for m in SPLIT_MODELS:
            add(f"attention-backend={b},chunked-prefill-size=100", m,
                "--attention-backend", b, "--chunked-prefill-size", "100")
            add(f"attention-backend={b},page-size=16", m,
                "--attention-backend", b, "--page-size", "16")
    for b in ("fa3", "flashinfer", "triton", "trtllm_mha", "fa4"):
        for k, n in ((1, 4), (4, 8)):
            add(f"eagle,topk={k},attention-backend={b}", "llama3-8b",
                "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                "{models}/llama3-8b", "--speculative-num-steps", "3",
                "--speculative-eagle-topk", str(k), "--speculative-num-draft-tokens", str(n),
                "--attention-backend", b)
    for b in ("flashmla", "trtllm_mla", "fa3", "triton", "flashinfer"):
        for k, n in ((1, 4), (2, 8)):
            add(f"nextn,topk={k},attention-backend={b}", "deepseek-v3-fp8",
                "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                "--speculative-eagle-topk", str(k), "--speculative-num-draft-tokens", str(n),
                "--attention-backend", b)
    for m in MODELS:  # a control: the same line late in another worker's run
        add("plain,again", m)
    return out


def main() -> None:
    """Print one JSON case a line."""
    for cid, argv in _cases():
        print(json.dumps({"id": cid, "argv": argv}))


if __name__ == "__main__":
    main()
