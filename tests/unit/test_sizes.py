"""preflight/sizes.py: each rule fires on SGLang's arithmetic and stays quiet where SGLang
accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from sglang_guard.config.guardconfig import PolicyConfig
from sglang_guard.preflight.compat import load_default_table
from sglang_guard.preflight.facts import GpuFacts, ModelFacts, ModelShape
from sglang_guard.preflight.preflight import Decision, preflight
from sglang_guard.preflight.shell.modelprobe import resolve_model
from sglang_guard.preflight.sizes import CHECKS, SizeFinding, check_sizes, confirm, holds_for
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.options import OptionTable

FP8 = (128, 128)
LLAMA = ModelFacts("/m", ("LlamaForCausalLM",), "mha", "llama", shape=ModelShape(
    num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
    context_length=131072))
QWEN2_FP8 = ModelFacts("/q", ("Qwen2ForCausalLM",), "mha", "qwen2", shape=ModelShape(
    num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944,
    context_length=32768, quant_method="fp8", weight_block_size=FP8))
QWEN3_MOE_FP8 = ModelFacts("/q3", ("Qwen3MoeForCausalLM",), "mha", "qwen3_moe", shape=ModelShape(
    num_attention_heads=32, num_key_value_heads=4, intermediate_size=6144,
    moe_intermediate_size=768, context_length=40960, quant_method="fp8",
    weight_block_size=FP8))
DSV3_FP8 = ModelFacts("/d", ("DeepseekV3ForCausalLM",), "mla", "deepseek_v3", shape=ModelShape(
    num_attention_heads=128, num_key_value_heads=128, intermediate_size=18432,
    moe_intermediate_size=2048, first_k_dense_replace=3, context_length=163840,
    quant_method="fp8", weight_block_size=FP8))
GPT_OSS = ModelFacts("/g", ("GptOssForCausalLM",), "mha", "gpt_oss", shape=ModelShape(
    num_attention_heads=64, num_key_value_heads=8, context_length=131072,
    quant_method="mxfp4"))
NO_SHAPE = ModelFacts("org/x", (), "unknown", None, "cannot resolve hub model")
H200 = GpuFacts(sm=90, source="override")


def _sizes(options: OptionTable, model: ModelFacts, *args: str,
           sm: int | None = 90, allow: bool = False) -> list[SizeFinding]:
    cl = parse_command_line(["--model-path", model.path, *args], options)
    return check_sizes(cl, model, sm=sm, allow_longer_context=allow)


def _kinds(found: list[SizeFinding]) -> list[tuple[str, str]]:
    return [(f.check.kind, f.flag) for f in found]


def _decide(options: OptionTable, model: ModelFacts, *args: str,
            policy: PolicyConfig | None = None) -> Decision:
    cl = parse_command_line(["--model-path", model.path, *args], options)
    return preflight(cl, options, load_default_table(), model=model, draft=None, gpu=H200,
                     policy=policy or PolicyConfig(), derived_dir="/state/derived")


def test_every_check_names_its_source_and_releases() -> None:
    for check in CHECKS:
        assert check.source.startswith("sglang/")
        assert "0.5.23" in SpecifierSet(check.releases)  # a PEP 440 range holding 0.5.23
        assert check.phase in ("args", "model_init", "load")
        # No upper bound (issue 19, item 8): the next release is judged by its own source.
        assert all(not spec.operator.startswith(("<", "==", "~")) for spec in
                   SpecifierSet(check.releases)), check
        assert holds_for(check, "0.6.0")


def test_a_newer_release_keeps_the_checks_its_source_holds() -> None:
    from sglang_guard.sglang.msgsearch import NOT_SERVER, normalise  # noqa: PLC0415
    from support.sglang import sglang_src  # noqa: PLC0415

    root = sglang_src()
    text = normalise("\n".join(
        p.read_text(encoding="utf-8", errors="replace")
        for p in sorted((root / "sglang").rglob("*.py"))
        if not p.relative_to(root).as_posix().startswith(NOT_SERVER)))
    ok, missing = confirm(text)
    # Every check's own text is in the release it cites; those resting on its lists are
    # not confirmable for another release, and nothing is confirmed without a source.
    assert {c.source for c in missing} == {c.source for c in CHECKS if c.lists_of}
    assert ok == {c.source for c in CHECKS if not c.lists_of}
    assert confirm(None) == (frozenset(), CHECKS)


def test_context_length_above_the_model_is_refused_with_both_numbers(
        options: OptionTable) -> None:
    found = _sizes(options, LLAMA, "--context-length", "131073")
    assert _kinds(found) == [("context_length", "--context-length")]
    assert "131073" in found[0].reason and "131072" in found[0].reason
    assert found[0].action == "refuse"
    assert not _sizes(options, LLAMA, "--context-length", "131072")
    assert not _sizes(options, LLAMA, "--context-length", "131073", allow=True)
    assert not _sizes(options, NO_SHAPE, "--context-length", "99999999")


def test_quantization_that_contradicts_the_checkpoint_is_dropped(options: OptionTable) -> None:
    found = _sizes(options, QWEN2_FP8, "--quantization", "awq")
    assert _kinds(found) == [("quantization", "--quantization")]
    assert found[0].action == "drop"
    d = _decide(options, QWEN2_FP8, "--quantization", "awq")
    assert d.verdict == "remediated" and "--quantization" not in d.argv_out


@pytest.mark.parametrize(("model", "flag"), [
    (QWEN2_FP8, "fp8"),            # the checkpoint's own method
    (QWEN2_FP8, "modelopt_fp4"),   # compatible_quantization_methods: modelopt_fp4 over fp8
    (QWEN2_FP8, "quark_mxfp4"),    # REQUANTIZATION_METHODS
    (QWEN2_FP8, "humming"),        # humming.py:503 takes a non-mxfp4 checkpoint over
    (QWEN2_FP8, "modelopt"),       # the ModelOpt hook may, with a quant_algo
    (LLAMA, "fp8"),                # online quantization of a bf16 checkpoint
    (LLAMA, "awq"),
])
def test_quantization_sglang_accepts_is_left_alone(options: OptionTable, model: ModelFacts,
                                                   flag: str) -> None:
    assert not _sizes(options, model, "--quantization", flag)


def test_unknown_quantization_method_is_refused(options: OptionTable) -> None:
    found = _sizes(options, LLAMA, "--quantization", "gptq")
    assert _kinds(found) == [("quantization", "--quantization")]
    assert found[0].action == "refuse"


def test_quantization_below_its_minimum_sm(options: OptionTable) -> None:
    found = _sizes(options, LLAMA, "--quantization", "w8a8_fp8", sm=80)
    assert _kinds(found) == [("quantization_sm", "--quantization")]
    assert not _sizes(options, LLAMA, "--quantization", "w8a8_fp8", sm=89)
    assert not _sizes(options, LLAMA, "--quantization", "w8a8_fp8", sm=None)


def test_gpt_oss_backend_allow_list(options: OptionTable) -> None:
    found = _sizes(options, GPT_OSS, "--attention-backend", "flashinfer")
    assert _kinds(found) == [("model_backend", "--attention-backend")]
    assert found[0].action == "drop"
    assert not _sizes(options, GPT_OSS, "--attention-backend", "fa3")
    assert not _sizes(options, LLAMA, "--attention-backend", "flashinfer")


def test_speculative_topk_with_trtllm_mha_and_paged_backends(options: OptionTable) -> None:
    spec = ("--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4")
    assert _kinds(_sizes(options, LLAMA, *spec, "--attention-backend", "trtllm_mha")) == [
        ("speculative", "--speculative-eagle-topk")]
    # flashmla sets page size 64 itself: the topk > 1 tree is then unsupported
    assert _kinds(_sizes(options, DSV3_FP8, *spec, "--attention-backend", "flashmla")) == [
        ("speculative", "--speculative-eagle-topk")]
    assert not _sizes(options, LLAMA, *spec, "--attention-backend", "fa3", "--page-size", "16")
    assert not _sizes(options, LLAMA, *spec, "--attention-backend", "flashinfer")
    one = ("--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1")
    assert not _sizes(options, LLAMA, *one, "--attention-backend", "trtllm_mha")


def test_chunked_prefill_against_the_page_size_sglang_sets(options: OptionTable) -> None:
    found = _sizes(options, DSV3_FP8, "--attention-backend", "flashmla",
                   "--chunked-prefill-size", "100")
    assert _kinds(found) == [("chunked_prefill_size", "--chunked-prefill-size")]
    assert "100 % 64 = 36" in found[0].reason
    assert not _sizes(options, DSV3_FP8, "--attention-backend", "flashmla",
                      "--chunked-prefill-size", "128")
    assert not _sizes(options, LLAMA, "--attention-backend", "fa3", "--chunked-prefill-size",
                      "100")
    assert not _sizes(options, LLAMA, "--page-size", "16", "--chunked-prefill-size", "-1")


def test_tp_and_heads(options: OptionTable) -> None:
    found = _sizes(options, QWEN2_FP8, "--tp", "8")
    assert found[0].check.kind == "tp_size" and "28 % 8 = 4" in found[0].reason
    assert found[0].cited == "sglang/srt/models/qwen2.py:167"
    kv = _sizes(options, LLAMA, "--tp", "16")  # 32 heads fine; 8 KV heads replicate: 16 % 8
    assert not kv
    odd = ModelFacts("/m", ("LlamaForCausalLM",), "mha", "llama",
                     shape=ModelShape(num_attention_heads=24, num_key_value_heads=6))
    found = _sizes(options, odd, "--tp", "4")  # KV heads >= TP: split them
    assert found[0].cited == "sglang/srt/models/llama.py:189" and "6 % 4 = 2" in found[0].reason
    few = ModelFacts("/m", ("LlamaForCausalLM",), "mha", "llama",
                     shape=ModelShape(num_attention_heads=24, num_key_value_heads=3))
    found = _sizes(options, few, "--tp", "8")  # KV heads < TP: replicate them
    assert found[0].cited == "sglang/srt/models/llama.py:193" and "8 % 3 = 2" in found[0].reason
    assert not _sizes(options, QWEN2_FP8, "--tp", "8", "--enable-dp-attention")  # not judged


def test_fp8_block_partitions(options: OptionTable) -> None:
    found = _sizes(options, QWEN3_MOE_FP8, "--tp", "4")
    assert _kinds(found) == [("fp8_block", "--tp-size")]
    assert "768 / TP 4 = 192" in found[0].reason and found[0].action == "refuse"
    assert not _sizes(options, QWEN3_MOE_FP8, "--tp", "2")
    assert not _sizes(options, QWEN3_MOE_FP8, "--tp", "4", "--ep-size", "4")  # not judged
    dense = _sizes(options, DSV3_FP8, "--tp", "32")
    assert [f.cited for f in dense] == ["sglang/srt/layers/quantization/fp8.py:605",
                                        "sglang/srt/layers/quantization/fp8.py:1588"]
    assert "--moe-dense-tp-size 1" in dense[0].reason
    with_dense_1 = _sizes(options, DSV3_FP8, "--tp", "32", "--moe-dense-tp-size", "1")
    assert [f.cited for f in with_dense_1] == ["sglang/srt/layers/quantization/fp8.py:1588"]
    assert not _sizes(options, DSV3_FP8, "--tp", "16")


def test_argument_phase_parallel_checks(options: OptionTable) -> None:
    assert _kinds(_sizes(options, LLAMA, "--tp", "8", "--moe-dense-tp-size", "2")) == [
        ("moe_dense_tp_size", "--moe-dense-tp-size")]
    assert not _sizes(options, LLAMA, "--tp", "8", "--moe-dense-tp-size", "8")
    assert _kinds(_sizes(options, LLAMA, "--tp", "3", "--nnodes", "2"))[0] == (
        "tp_size", "--tp-size")
    assert not _sizes(options, LLAMA, "--tp", "4", "--nnodes", "2")


def test_a_size_is_refused_never_rewritten(options: OptionTable) -> None:
    d = _decide(options, QWEN3_MOE_FP8, "--tp", "4")
    assert d.verdict == "refused" and d.argv_out == d.argv_in
    assert [(f.flag, f.action, f.kind) for f in d.findings] == [
        ("--tp-size", "refuse", "fp8_block")]
    assert "fp8.py:1588 (line of 0.5.23; the same rule in" in (d.findings[0].source or "")
    warned = _decide(options, QWEN3_MOE_FP8, "--tp", "4", policy=PolicyConfig("warn"))
    assert warned.verdict == "ok" and warned.findings[0].action == "warn"


def test_one_finding_per_flag_backend_checks_first(options: OptionTable) -> None:
    d = _decide(options, GPT_OSS, "--attention-backend", "flashmla")  # MLA-only: table first
    # SGLang's argument phase refuses it for GptOssForCausalLM (its allow-list) before the
    # backend is ever built: that is the finding's kind.
    assert [(f.flag, f.kind) for f in d.findings] == [("--attention-backend", "model")]


def test_modelprobe_reads_the_shape_and_caches_it(tmp_path: Path) -> None:
    models = Path(__file__).resolve().parents[1] / "data" / "h200-models"
    first = resolve_model(str(models / "deepseek-v3-fp8"))
    again = resolve_model(str(models / "deepseek-v3-fp8"))  # from the facts cache
    assert first.shape == again.shape
    assert first.shape is not None
    assert (first.shape.num_attention_heads, first.shape.moe_intermediate_size) == (128, 2048)
    assert first.shape.context_length == 163840  # rope factor 40 ignored: original_max set
    assert (first.shape.quant_method, first.shape.weight_block_size) == ("fp8", (128, 128))
    llama = resolve_model(str(models / "llama3-8b"), use_cache=False)
    assert llama.shape is not None and llama.shape.context_length == 131072  # llama3 rope
    assert llama.shape.quant_method is None


def test_a_release_outside_a_checks_range_is_not_judged_by_it(options: OptionTable) -> None:
    cl = parse_command_line(["--model-path", "/m", "--tp", "8", "--moe-dense-tp-size", "2"],
                            options)
    assert check_sizes(cl, LLAMA, sm=90, release="0.5.23")
    assert not check_sizes(cl, LLAMA, sm=90, release="0.5.10")  # message since 0.5.13
    assert [holds_for(c, "0.5.1") for c in CHECKS].count(True) >= 9
    assert not any(holds_for(c, "not-a-version") for c in CHECKS)
