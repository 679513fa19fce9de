"""The GPU launch matrix for real SGLang 0.5.17 on the H200: one JSON case a line.

    python tools/h200/gpu_cases.py > .h200/h200/gpu-cases.jsonl

Each case: `id`, `model` (a folder under configs/models), `args` (the line's own flags),
`mode` (plain, guard, guard-nopf), `phase` (1: needs no FA3 kernels, 2: after flash_ops
arrives), `exclusive` (runs with the GPU to itself: it takes most of its memory), and the
base flags it keeps (`base`: which of serve_matrix.BASE the line does not override), and
`rerun` (1 or 2: the device run of the second session, with the guard as it then was, that ran
the line again; absent for the lines the first session's record keeps). Deterministic: the same
list every time.
"""

from __future__ import annotations

import json

# SGLang 0.5.17 ATTENTION_BACKEND_CHOICES (sglang/srt/server_args.py:175-203).
BACKENDS = ("triton", "torch_native", "flex_attention", "dsa", "nsa", "dsv4", "compressed",
            "cutlass_mla", "fa3", "fa4", "flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla",
            "tokenspeed_mla", "trtllm_mha", "dual_chunk_flash_attn", "hpc_ops", "aiter", "wave",
            "intel_amx", "ascend", "intel_xpu")
MHA = "llama-hd128"
MLA = "dsv3-mla576"
FA3 = "fa3"
SPEC = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2",
        "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4")


def _phase(args: list[str]) -> int:
    """2 when the line (or SGLang's default pick on SM90, fa3) needs flash_ops."""
    names = [a for i, a in enumerate(args) if i and args[i - 1].endswith("attention-backend")]
    if not any(a.endswith("attention-backend") for a in args):
        return 2
    if FA3 in names:
        return 2
    backend_flags = {a for a in args if a.endswith("attention-backend")}
    # a split names only one phase: the other takes SGLang's default (fa3 on SM90)
    if "--attention-backend" not in backend_flags and len(backend_flags) < 2:
        return 2
    return 1


def cases() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []

    def add(cid: str, model: str, *args: str, mode: str = "plain", phase: int | None = None,
            exclusive: bool = False, drop_base: tuple[str, ...] = (),
            rerun: int | None = None) -> None:
        a = list(args)
        case: dict[str, object] = {
            "id": f"{model}|{cid}" + ("" if mode == "plain" else f"|{mode}"), "model": model,
            "args": a, "mode": mode, "phase": phase if phase is not None else _phase(a),
            "exclusive": exclusive, "drop_base": list(drop_base)}
        if rerun is None and mode != "plain":
            rerun = phase  # every guarded run again, with the guard of the second session
        if rerun is not None:
            case["rerun"] = rerun
        out.append(case)

    for m in (MHA, MLA):
        add("default", m)
        for b in BACKENDS:
            add(f"attention-backend={b}", m, "--attention-backend", b)
    # prefill/decode splits
    for p, d in ((FA3, "triton"), ("triton", FA3), ("flashinfer", "triton")):
        add(f"prefill={p},decode={d}", MHA, "--prefill-attention-backend", p,
            "--decode-attention-backend", d)
    for p, d in ((FA3, "flashmla"), (FA3, "triton"), ("flashinfer", "triton"),
                 ("triton", "flashmla"), (FA3, "cutlass_mla")):
        add(f"prefill={p},decode={d}", MLA, "--prefill-attention-backend", p,
            "--decode-attention-backend", d)
    add("decode=triton", MHA, "--decode-attention-backend", "triton")
    # KV cache dtypes
    for m, b, kv in ((MHA, "triton", "fp8_e4m3"), (MHA, "triton", "fp8_e5m2"),
                     (MHA, FA3, "fp8_e4m3"), (MHA, "flashinfer", "fp8_e5m2"),
                     (MHA, "triton", "bf16"), (MHA, "triton", "fp4_e2m1"),
                     (MHA, "triton", "mxfp8"), (MHA, "triton", "nvfp4"),
                     (MLA, "triton", "fp8_e4m3"), (MLA, "flashinfer", "fp8_e4m3"),
                     (MLA, "flashmla", "fp8_e4m3"), (MLA, "triton", "fp4_mx_block16")):
        add(f"attention-backend={b},kv-cache-dtype={kv}", m, "--attention-backend", b,
            "--kv-cache-dtype", kv)
    # CUDA graphs on
    add("cuda-graph", MHA, "--cuda-graph-max-bs", "16", drop_base=("cuda-graph",))
    add("cuda-graph", MLA, "--cuda-graph-max-bs", "16", drop_base=("cuda-graph",))
    add("attention-backend=triton,cuda-graph", MHA, "--attention-backend", "triton",
        "--cuda-graph-max-bs", "16", drop_base=("cuda-graph",))
    # page sizes
    for m, b, ps in ((MHA, "triton", "16"), (MHA, FA3, "16"), (MHA, "flashinfer", "16"),
                     (MLA, "flashmla", "16"), (MLA, "triton", "16"), (MLA, FA3, "16"),
                     (MHA, "trtllm_mha", "8"), (MHA, "hpc_ops", "16")):
        add(f"attention-backend={b},page-size={ps}", m, "--attention-backend", b,
            "--page-size", ps)
    # the failures users hit: context above the model's (2048), a KV pool too small
    for m in (MHA, MLA):
        add("attention-backend=triton,context-length=4096", m, "--attention-backend", "triton",
            "--context-length", "4096")
        add("attention-backend=triton,mem-fraction-static=0.001", m, "--attention-backend",
            "triton", "--mem-fraction-static", "0.001", drop_base=("mem-fraction-static",))
    # speculative decoding (NEXTN: the MLA model's own MTP layer drafts): a topk of 2, which
    # FlashInfer's MLA draft backend and FlashMLA's page size do not take
    for b in ("flashinfer", "flashmla"):
        add(f"attention-backend={b},speculative-eagle-topk=2", MLA, "--attention-backend", b,
            *SPEC, rerun=1)
    # guarded runs (sglang-guard run) on lines that die, and two that serve. The phase is what
    # the line needs as the current guard launches it: a backend dropped in preflight leaves
    # SGLang's default, fa3 on SM90.
    guarded = [
        ("attention-backend=cutedsl_mla", MHA, ("--attention-backend", "cutedsl_mla"), 2),
        ("attention-backend=flashmla", MHA, ("--attention-backend", "flashmla"), 2),
        ("attention-backend=torch_native", MLA, ("--attention-backend", "torch_native"), 2),
        ("attention-backend=triton,context-length=4096", MHA,
         ("--attention-backend", "triton", "--context-length", "4096"), 1),
        ("attention-backend=triton,context-length=4096", MLA,
         ("--attention-backend", "triton", "--context-length", "4096"), 1),
        ("attention-backend=triton,mem-fraction-static=0.001", MHA,
         ("--attention-backend", "triton", "--mem-fraction-static", "0.001"), 1),
        ("attention-backend=triton,mem-fraction-static=0.001", MLA,
         ("--attention-backend", "triton", "--mem-fraction-static", "0.001"), 1),
        ("attention-backend=triton", MHA, ("--attention-backend", "triton"), 1),
        ("default", MLA, (), 2),
        ("attention-backend=intel_amx", MHA, ("--attention-backend", "intel_amx"), 2),
        ("attention-backend=cutlass_mla", MLA, ("--attention-backend", "cutlass_mla"), 2),
        ("prefill=fa3,decode=cutlass_mla", MLA,
         ("--prefill-attention-backend", FA3, "--decode-attention-backend", "cutlass_mla"), 2),
        ("attention-backend=flashinfer,speculative-eagle-topk=2", MLA,
         ("--attention-backend", "flashinfer", *SPEC), 2),
        ("attention-backend=flashmla,speculative-eagle-topk=2", MLA,
         ("--attention-backend", "flashmla", *SPEC), 1),
    ]
    for cid, m, args, ph in guarded:
        keep = ("mem-fraction-static",) if "--mem-fraction-static" in args else ()
        add(cid, m, *args, mode="guard", phase=ph, drop_base=keep)
    # without preflight only the log rules act: a rule's fix, or one relaunch of the same line
    # and then exit 75 with SGLang's own line (give_up_on_repeat), never a crash loop
    nopf = [
        ("attention-backend=cutedsl_mla", MHA, "cutedsl_mla", 2),
        ("attention-backend=flashmla", MHA, "flashmla", 1),
        ("attention-backend=intel_amx", MHA, "intel_amx", 1),
        ("attention-backend=torch_native", MLA, "torch_native", 1),
        ("attention-backend=cutlass_mla", MLA, "cutlass_mla", 2),
    ]
    for cid, m, b, ph in nopf:
        add(cid, m, "--attention-backend", b, mode="guard-nopf", phase=ph)
    # CUDA-graph capture with the static pool taking almost all memory: the GPU to itself
    oom = ("--mem-fraction-static", "0.985", "--cuda-graph-max-bs", "4096")
    drop = ("mem-fraction-static", "max-total-tokens", "cuda-graph")
    add("cuda-graph-max-bs=4096,mem-fraction-static=0.985", MHA, *oom, phase=2, exclusive=True,
        drop_base=drop)
    add("cuda-graph-max-bs=4096,mem-fraction-static=0.985", MHA, *oom, mode="guard", phase=2,
        exclusive=True, drop_base=drop)
    return out


def main() -> None:
    for c in cases():
        print(json.dumps(c, separators=(",", ":")))


if __name__ == "__main__":
    main()
