"""Checks beyond the attention flags: sizes, context, quantization and speculative combinations.

Pure: the command line and the model's shape in, findings out. Each check rests on one
SGLang rule, cited as `sglang/...:LINE` of 0.5.23 (for the argument-phase ones, the frame
that raised on the H200 run), and names the first release whose wheel carries the same
message (`Check.releases`, read from the 42 PyPI wheels 0.5.1-0.5.23; open-ended: a newer
release keeps a check where its own source still holds the rule, `confirm`). Lists that
changed between releases are 0.5.23's (`Check.lists_of`).
Where only a person can choose the fix (a TP size, a context length), the finding refuses
with the arithmetic; a flag is dropped only where SGLang's own default is known to fit.
"""

from __future__ import annotations

from typing import Literal

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from sglang_guard.common.record import record
from sglang_guard.config.guardconfig import PolicyConfig
from sglang_guard.preflight.facts import ModelFacts, ModelShape
from sglang_guard.sglang.argv import CommandLine

Phase = Literal["args", "model_init", "load"]
CITED = "0.5.23"  # the release whose file:line the checks cite (a citation, not a range)


@record
class Check:
    """One SGLang rule: where it lives, in which phase it fires, the releases it holds for."""

    kind: str
    phase: Phase  # "args": the argument phase (verified on an H200); later phases: by source
    source: str
    # PEP 440 specifier: the first release whose source has the rule, and on. No upper
    # bound: a release newer than the tables keeps the check where its own source still
    # holds `needle` (unconfirmed: it warns), see `confirm`.
    releases: str
    needle: str  # SGLang's own text of the rule (a template, sglang/msgsearch.py)
    # The check also rests on lists read from one release (a method list, SGLang's own page
    # rewrites): a release newer than the tables cannot confirm those, so there it warns.
    lists_of: str | None = None


CONTEXT = Check("context_length", "args", "sglang/srt/configs/model_config.py:1314",
                ">=0.5.1", "is greater than the derived context_length")
QUANT_MISMATCH = Check("quantization", "args", "sglang/srt/configs/model_config.py:2143",
                       ">=0.5.1", "does not match the quantization method specified in the "
                       "`quantization` argument", lists_of="0.5.23")  # _COMPATIBLE below
QUANT_UNKNOWN = Check("quantization", "args", "sglang/srt/configs/model_config.py:2152",
                      ">=0.5.23",  # the message is in every 0.5.x; the method list is 0.5.23's
                      "Unknown quantization method: {}. Must be one of", lists_of="0.5.23")
GPT_OSS = Check("model_backend", "args", "sglang/srt/arg_groups/model_hook.py:537",
                ">=0.5.13",  # this list; shorter lists since 0.5.1
                "GptOssForCausalLM requires one of", lists_of="0.5.23")
SPEC_TRTLLM_TOPK = Check("speculative", "args", "sglang/srt/arg_groups/speculative_hook.py:1178",
                         ">=0.5.1", "trtllm_mha backend only supports topk = 1 for "
                         "speculative decoding.")
SPEC_PAGE_TOPK = Check("speculative", "args", "sglang/srt/arg_groups/speculative_hook.py:1278",
                       ">=0.5.13", "speculative_eagle_topk > 1 with page_size > 1 is only "
                       "supported on", lists_of="0.5.23")  # PAGE_TREE_BACKENDS
CHUNKED_PAGE = Check("chunked_prefill_size", "args",
                     "sglang/srt/arg_groups/validation_hook.py:244",
                     ">=0.5.1", "chunked_prefill_size must be divisible by page_size",
                     lists_of="0.5.23")  # the message; _FORCED_PAGE is 0.5.23's
MOE_DENSE_TP = Check("moe_dense_tp_size", "args", "sglang/srt/arg_groups/validation_hook.py:207",
                     ">=0.5.13", "moe_dense_tp_size only supports None, 1, or tp_size currently")
TP_NODES = Check("tp_size", "args", "sglang/srt/arg_groups/validation_hook.py:179",
                 ">=0.5.1", "tp_size must be divisible by number of nodes")
TP_HEADS = Check("tp_size", "model_init", "sglang/srt/models/<model>.py (_HEAD_SPLIT_ARCHS)",
                 ">=0.5.1", "total_num_heads % tp_size == 0")
FP8_DENSE = Check("fp8_block", "model_init", "sglang/srt/layers/quantization/fp8.py:605",
                  ">=0.5.1", "is not divisible by weight quantization block_n")
FP8_MOE = Check("fp8_block", "model_init", "sglang/srt/layers/quantization/fp8.py:1588",
                ">=0.5.1", "The output_size of gate's and up's weight")
QUANT_SM = Check("quantization_sm", "load", "sglang/srt/model_loader/loader.py:259",
                 ">=0.5.1", "is not supported for the current GPU. Minimum capability",
                 lists_of="0.5.23")  # MIN_SM
CHECKS = (CONTEXT, QUANT_MISMATCH, QUANT_UNKNOWN, GPT_OSS, SPEC_TRTLLM_TOPK, SPEC_PAGE_TOPK,
          CHUNKED_PAGE,
          MOE_DENSE_TP, TP_NODES, TP_HEADS, FP8_DENSE, FP8_MOE, QUANT_SM)


def confirm(source: str | None) -> tuple[frozenset[str], tuple[Check, ...]]:
    """For a release newer than every table: the checks its source confirms (by `source`
    id) and those it cannot (their text is gone, or they rest on an older release's lists).

    `source` is the release's normalised source text (None: no source on disk).
    """
    from sglang_guard.sglang.msgsearch import holds  # noqa: PLC0415

    ok = frozenset(c.source for c in CHECKS
                   if source is not None and c.lists_of is None and holds(source, c.needle))
    return ok, tuple(c for c in CHECKS if c.source not in ok)


# ModelConfig._verify_quantization (model_config.py:2000-2160, 0.5.23): QUANTIZATION_METHODS
# as its "Unknown quantization method" message lists them on CUDA, the CLI methods a
# checkpoint's own method may be overridden with, and the online re-quantizations.
QUANTIZATION_METHODS = frozenset((
    "fp8", "mxfp8", "minimax_m3_nvfp4", "blockwise_int8", "modelopt", "modelopt_fp8",
    "modelopt_fp4", "nvfp4_online", "modelopt_mixed", "w8a8_int8", "w8a8_fp8", "awq",
    "awq_marlin", "bitsandbytes", "gguf", "gptq_marlin", "moe_wna16", "compressed-tensors",
    "w4afp8", "petit_nvfp4", "quark", "quark_mxfp4", "auto-round", "auto-round-int8",
    "modelslim", "quark_int4fp8_moe", "humming", "mxfp_w4a8", "mxfp4"))
_COMPATIBLE = {"modelopt_fp8": ("modelopt",), "modelopt_fp4": ("modelopt", "fp8"),
               "modelopt_mixed": ("modelopt",), "nvfp4_online": ("fp8", "modelopt_fp8"),
               "minimax_m3_nvfp4": ("mxfp8",), "petit_nvfp4": ("modelopt",),
               "w8a8_int8": ("compressed-tensors", "compressed_tensors"),
               "w8a8_fp8": ("compressed-tensors", "compressed_tensors"),
               "auto-round-int8": ("compressed-tensors", "compressed_tensors")}
_REQUANTIZATION = ("quark_mxfp4",)
# Checkpoint methods judged here (the H200 run confirmed their verdicts); others are not.
_JUDGED_CHECKPOINTS = ("fp8", "mxfp4")
# CLI methods whose override_quantization_method hook can take such a checkpoint over
# (model_config.py:2087-2096 asks every method): humming.py:503 for anything but mxfp4,
# and the ModelOpt hook (base_config.py:223) for --quantization modelopt with a
# quant_algo. Never judged, so never dropped.
_OVERRIDE_HOOKS = {"fp8": ("humming", "modelopt"), "mxfp4": ("modelopt",)}
# get_min_capability() of the methods' configs (sglang/srt/layers/quantization/*.py, 0.5.23).
# Only methods whose config class was read; fp8's depends on the platform and is left out.
MIN_SM = {"w8a8_fp8": 89,        # w8a8_fp8.py:67
          "modelopt_fp8": 89,    # modelopt_quant.py:463
          "modelopt_fp4": 80,    # modelopt_quant.py:1550
          "nvfp4_online": 100,   # nvfp4_online.py:136
          "petit_nvfp4": 90,     # petit.py:64
          "w4afp8": 90,          # w4afp8.py:71
          "mxfp4": 80,           # mxfp4.py:339
          "blockwise_int8": 80,  # blockwise_int8.py:84
          "w8a8_int8": 75,       # w8a8_int8.py:88
          "moe_wna16": 70,       # moe_wna16.py:127
          "bitsandbytes": 70}    # bitsandbytes.py:101
# model_hook.py:522 (0.5.23): the backends GptOssForCausalLM takes, prefill and decode.
GPT_OSS_BACKENDS = ("triton", "trtllm_mha", "fa3", "fa4", "ascend", "intel_amx", "intel_xpu",
                    "aiter")
# speculative_hook.py:1273: backends with the topk > 1 paged draft tree.
PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")
# overrides.py:1146-1197: page sizes SGLang sets itself for these backends when none fits.
_FORCED_PAGE = {"flashmla": (64,), "trtllm_mla": (32, 64), "cutedsl_mla": (32, 64),
                "trtllm_mha": (16, 32, 64, 128), "hpc_ops": (64,)}
# Architectures whose attention asserts heads % TP == 0, then KV heads % TP == 0 (KV heads
# >= TP) or TP % KV heads == 0: the model file and the line of the first assert (0.5.23).
_HEAD_SPLIT_ARCHS = {"LlamaForCausalLM": "sglang/srt/models/llama.py:183",
                     "MistralForCausalLM": "sglang/srt/models/llama.py:183",  # mistral.py:33
                     "Qwen2ForCausalLM": "sglang/srt/models/qwen2.py:167",
                     "Qwen3ForCausalLM": "sglang/srt/models/qwen3.py:166",
                     "Qwen3MoeForCausalLM": "sglang/srt/models/qwen3_moe.py:506",
                     "GptOssForCausalLM": "sglang/srt/models/gpt_oss.py:394"}
_DENSE_MLP_ARCHS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                    "MistralForCausalLM")
_MOE_ARCHS = ("Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")
_DENSE_AND_MOE_ARCHS = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")


@record
class SizeFinding:
    """What a check found: the flag it is about, why, SGLang's words, the proposed action."""

    check: Check
    flag: str
    value: str | None
    reason: str
    sglang_message: str | None
    action: Literal["refuse", "drop"] = "refuse"
    source: str | None = None  # where the check's source is per model: this model's line

    @property
    def cited(self) -> str:
        """The SGLang file:line this finding rests on."""
        return self.source or self.check.source


def holds_for(check: Check, release: str | None) -> bool:
    """True when the release's source has the check's rule (None: the release the rules
    cite). A release newer than the tables is in range; whether its source still has the
    rule is `confirm`'s answer."""
    if release is None:
        return True
    try:
        return Version(release) in SpecifierSet(check.releases)
    except InvalidVersion:
        return False


def check_sizes(cl: CommandLine, model: ModelFacts, *, sm: int | None,
                allow_longer_context: bool = False,
                release: str | None = None) -> list[SizeFinding]:
    """Every size/combination rule the command line breaks that `release` has, argument-phase
    ones first; a release outside a check's range is not judged by it."""
    return [f for f in _all_checks(cl, model, sm=sm, allow_longer_context=allow_longer_context)
            if holds_for(f.check, release)]


def _all_checks(cl: CommandLine, model: ModelFacts, *, sm: int | None,
                allow_longer_context: bool) -> list[SizeFinding]:
    shape = model.shape
    found: list[SizeFinding] = []
    found += _context(cl, shape, allow_longer_context)
    found += _quantization(cl, shape, sm)
    found += _gpt_oss(cl, model)
    found += _speculative(cl)
    found += _chunked(cl)
    found += _parallel(cl, model)
    return found


def policy_action(policy: PolicyConfig, item: SizeFinding) -> Literal["refuse", "drop", "warn"]:
    """A refusal stays a refusal except under policy warn; a drop follows the flag's policy."""
    mode = policy.mode(item.flag)
    if mode == "warn":
        return "warn"
    if item.action == "refuse" or mode == "fail":
        return "refuse"
    return "drop"


def _int(cl: CommandLine, dest: str) -> int | None:
    raw = cl.value(dest)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _context(cl: CommandLine, shape: ModelShape | None,
             allow_longer: bool) -> list[SizeFinding]:
    asked = _int(cl, "context_length")
    if shape is None or shape.context_length is None or asked is None or allow_longer:
        return []
    derived = shape.context_length
    if asked <= derived:
        return []
    return [SizeFinding(
        CONTEXT, "--context-length", str(asked),
        f"--context-length {asked} is above the model's own context length {derived} "
        f"(config.json, as SGLang derives it); choose {derived} or less, or set "
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 if you mean it",
        f"Warning: User-specified context_length ({asked}) is greater than the derived "
        f"context_length ({derived}). ...")]


def _quantization(cl: CommandLine, shape: ModelShape | None, sm: int | None) -> list[SizeFinding]:
    asked = cl.value("quantization")
    ckpt = shape.quant_method if shape else None
    out: list[SizeFinding] = []
    if asked is not None:
        q = asked.lower()
        if ckpt in _JUDGED_CHECKPOINTS and q != ckpt and q not in _REQUANTIZATION \
                and ckpt not in _COMPATIBLE.get(q, ()) and q not in _OVERRIDE_HOOKS[ckpt]:
            return [SizeFinding(
                QUANT_MISMATCH, "--quantization", asked,
                f"the checkpoint is quantized with {ckpt} (config.json quantization_config) "
                f"and --quantization {asked} is neither it nor a method SGLang accepts over "
                "it; drop the flag so SGLang reads the checkpoint's own method",
                "Quantization method specified in the model config "
                f"({ckpt}) does not match the quantization method specified in the "
                f"`quantization` argument ({q}).", action="drop")]
        if ckpt is None and q not in QUANTIZATION_METHODS:
            return [SizeFinding(
                QUANT_UNKNOWN, "--quantization", asked,
                f"--quantization {asked} is an option choice, but SGLang "
                f"{QUANT_UNKNOWN.lists_of} has no such "
                "quantization method on CUDA",
                f"Unknown quantization method: {q}. Must be one of [...].")]
    method = (asked.lower() if asked else None) or ckpt
    need = MIN_SM.get(method or "")
    if need is not None and sm is not None and 0 < sm < need:
        out.append(SizeFinding(
            QUANT_SM, "--quantization" if asked else "--model-path",
            asked or cl.value("model_path"),
            f"quantization {method} needs SM{need} or newer; this GPU is SM{sm}",
            f"The quantization method {method} is not supported for the current GPU. "
            f"Minimum capability: {need}. Current capability: {sm}."))
    return out


def _gpt_oss(cl: CommandLine, model: ModelFacts) -> list[SizeFinding]:
    if not model.architectures or model.architectures[0] != "GptOssForCausalLM":
        return []
    out = []
    for dest, flag in (("attention_backend", "--attention-backend"),
                       ("prefill_attention_backend", "--prefill-attention-backend"),
                       ("decode_attention_backend", "--decode-attention-backend")):
        value = cl.value(dest)
        if value is not None and value not in GPT_OSS_BACKENDS:
            out.append(SizeFinding(
                GPT_OSS, flag, value,
                f"GptOssForCausalLM takes only {', '.join(GPT_OSS_BACKENDS)}; dropped so "
                "SGLang picks its own for this model",
                f"GptOssForCausalLM requires one of {list(GPT_OSS_BACKENDS)} attention "
                "backend, but got the following backends", action="drop"))
    return out


def _speculative(cl: CommandLine) -> list[SizeFinding]:
    topk = _int(cl, "speculative_eagle_topk")
    backend = cl.value("attention_backend")
    if not cl.value("speculative_algorithm") or topk is None or topk <= 1 or backend is None:
        return []
    if backend == "trtllm_mha":
        return [SizeFinding(
            SPEC_TRTLLM_TOPK, "--speculative-eagle-topk", str(topk),
            f"--attention-backend trtllm_mha takes only --speculative-eagle-topk 1 (got {topk})",
            "trtllm_mha backend only supports topk = 1 for speculative decoding.")]
    page = _effective_page(cl)
    if page > 1 and backend not in PAGE_TREE_BACKENDS:
        return [SizeFinding(
            SPEC_PAGE_TOPK, "--speculative-eagle-topk", str(topk),
            f"--speculative-eagle-topk {topk} with page size {page} needs one of "
            f"{', '.join(PAGE_TREE_BACKENDS)}; --attention-backend {backend} is not",
            "speculative_eagle_topk > 1 with page_size > 1 is only supported on "
            f"{PAGE_TREE_BACKENDS}; got attention_backend={backend!r}.")]
    return []


def _effective_page(cl: CommandLine) -> int:
    """The page size after SGLang's own backend rewrites (overrides.py:1143-1197): 64 where
    the given one does not fit flashmla, trtllm_mla, cutedsl_mla, trtllm_mha or hpc_ops."""
    page = _int(cl, "page_size") or 1
    named = {cl.value(d) for d in ("attention_backend", "decode_attention_backend")}
    if cl.value("prefill_attention_backend") == "trtllm_mha":
        named.add("trtllm_mha")
    for backend, fits in _FORCED_PAGE.items():
        if backend in named and page not in fits:
            page = 64
    return page


def _chunked(cl: CommandLine) -> list[SizeFinding]:
    size = _int(cl, "chunked_prefill_size")
    if size is None or size <= 0 or cl.value("disaggregation_mode") == "decode":
        return []
    page = _effective_page(cl)
    if size % page == 0:
        return []
    return [SizeFinding(
        CHUNKED_PAGE, "--chunked-prefill-size", str(size),
        f"--chunked-prefill-size {size} is not a multiple of the page size {page} "
        f"({size} % {page} = {size % page}; SGLang sets page size {page} for this attention "
        "backend itself when the given one does not fit); choose a multiple of it",
        "chunked_prefill_size must be divisible by page_size")]


def _divides(n: int, d: int) -> bool:
    return d > 0 and n % d == 0


def _parallel(cl: CommandLine, model: ModelFacts) -> list[SizeFinding]:
    tp = _int(cl, "tp_size") or 1
    out: list[SizeFinding] = []
    nnodes = _int(cl, "nnodes") or 1
    pp = _int(cl, "pp_size") or 1
    if not _divides(tp * pp, nnodes) and cl.value("ep_join_mode") != "scale":
        out.append(SizeFinding(TP_NODES, "--tp-size", str(tp),
                               f"--tp {tp} x --pp {pp} over --nnodes {nnodes}: {tp * pp} % "
                               f"{nnodes} = {tp * pp % nnodes}; TP x PP must split evenly "
                               "over the nodes",
                               "tp_size must be divisible by number of nodes"))
    dense_tp = _int(cl, "moe_dense_tp_size")
    if dense_tp is not None and dense_tp not in (1, tp):
        out.append(SizeFinding(MOE_DENSE_TP, "--moe-dense-tp-size", str(dense_tp),
                               f"--moe-dense-tp-size {dense_tp} with --tp {tp}: SGLang takes "
                               f"only 1 or the TP size ({tp})",
                               "moe_dense_tp_size only supports None, 1, or tp_size currently"))
    shape = model.shape
    if tp <= 1 or shape is None or not model.architectures:
        return out
    if any(cl.present(d) for d in ("enable_dp_attention", "attn_dp_size", "dp_size",
                                   "attn_cp_size", "ep_size", "moe_a2a_backend", "pp_size")):
        return out  # attention/expert TP is then not the plain TP size: not judged here
    arch = model.architectures[0]
    out += _heads(arch, shape, tp)
    out += _fp8_blocks(arch, shape, tp, dense_tp)
    return out


def _heads(arch: str, shape: ModelShape, tp: int) -> list[SizeFinding]:
    heads, kv = shape.num_attention_heads, shape.num_key_value_heads
    source = _HEAD_SPLIT_ARCHS.get(arch)
    if source is None or heads is None:
        return []
    if heads % tp:
        return [SizeFinding(TP_HEADS, "--tp-size", str(tp),
                            f"--tp {tp} does not divide the model's {heads} attention heads "
                            f"({heads} % {tp} = {heads % tp}); choose a TP size that divides "
                            f"{heads}", f"AssertionError: total_num_heads % tp_size == 0 "
                            f"({heads} % {tp})", source=source)]
    if kv is not None and not (_divides(kv, tp) if kv >= tp else _divides(tp, kv)):
        rel = f"{kv} % {tp} = {kv % tp}" if kv >= tp else f"{tp} % {kv} = {tp % kv}"
        path, line = source.rsplit(":", 1)
        kv_line = f"{path}:{int(line) + (6 if kv >= tp else 10)}"
        return [SizeFinding(TP_HEADS, "--tp-size", str(tp),
                            f"--tp {tp} and the model's {kv} KV heads: one must divide the "
                            f"other ({rel})", f"AssertionError ({rel})", source=kv_line)]
    return []


def _fp8_blocks(arch: str, shape: ModelShape, tp: int, dense_tp: int | None) -> list[SizeFinding]:
    if shape.quant_method != "fp8" or shape.weight_block_size is None:
        return []
    block_n = shape.weight_block_size[0]
    out: list[SizeFinding] = []
    dense = shape.intermediate_size
    dense_split = dense_tp if dense_tp is not None else tp
    has_dense = arch in _DENSE_MLP_ARCHS or (
        arch in _DENSE_AND_MOE_ARCHS and (shape.first_k_dense_replace or 0) > 0)
    if has_dense and dense is not None and dense_split > 1 and (dense // dense_split) % block_n:
        part = dense // dense_split
        # deepseek_v2.py:2665: the dense MLP is "replicated" when moe_dense_tp_size == 1
        # (layer_boundary/layout.py:84), else split over TP; the flag's help says it is for
        # exactly this (arg_groups/fields/parallel.py:292).
        fix = (" or add --moe-dense-tp-size 1 (SGLang's own switch for this: it keeps the "
               "dense MLP layers whole on each rank, deepseek_v2.py:2665)"
               if arch in _DENSE_AND_MOE_ARCHS else "")
        out.append(SizeFinding(
            FP8_DENSE, "--tp-size", str(tp),
            f"block-FP8 weights (weight_block_size [{block_n}, ...]): the dense MLP's "
            f"{dense} / TP {dense_split} = {part} per rank is not a multiple of block_n "
            f"{block_n}; choose a TP size that keeps it one{fix}",
            f"Weight output_partition_size = {part} is not divisible by weight quantization "
            f"block_n = {block_n}."))
    moe = shape.moe_intermediate_size
    if arch in _MOE_ARCHS and moe is not None and (moe // tp) % block_n:
        part = moe // tp
        out.append(SizeFinding(
            FP8_MOE, "--tp-size", str(tp),
            f"block-FP8 experts (weight_block_size [{block_n}, ...]): moe_intermediate_size "
            f"{moe} / TP {tp} = {part} per rank is not a multiple of block_n {block_n}; "
            "choose a smaller TP size, or expert parallelism (--ep-size) so experts are not "
            "split",
            f"The output_size of gate's and up's weight = {part} is not divisible by weight "
            f"quantization block_n = {block_n}."))
    return out


def phase_of(source: str) -> Phase | None:
    """The phase of a source this module cites (None: not one of its checks)."""
    for check in CHECKS:
        if source == check.source:
            return check.phase
    if source.startswith("sglang/srt/models/") and source.split(":", maxsplit=1)[0] in {
            v.split(":")[0] for v in _HEAD_SPLIT_ARCHS.values()}:
        return TP_HEADS.phase
    return None
