"""The backend table and its checker, against expectations written here from SGLang 0.5.23."""

from __future__ import annotations

import json
import re

import pytest

from sglang_guard.errors import ConfigError, InputError
from sglang_guard.preflight.compat import (
    BACKEND_FLAGS,
    CompatTable,
    Problem,
    best_fit,
    check_backend,
    load_default_table,
    parse_table,
)
from sglang_guard.resources import config_path

ATTN, PREFILL, DECODE, DRAFT = BACKEND_FLAGS
ARCHS = ("mla", "mha", "ssm", "unknown")
SMS = (None, 80, 86, 89, 90, 100, 103, 120)


@pytest.fixture(scope="module")
def table() -> CompatTable:
    return load_default_table()


def _span(*ranges: tuple[int, int]) -> frozenset[int]:
    return frozenset(sm for lo, hi in ranges for sm in range(lo, hi + 1))


HOPPER = _span((90, 99))
SM10X = _span((100, 109))
BLACKWELL = _span((100, 129))
TRTLLM_MHA = _span((90, 109), (120, 129))

# --- The oracle: written from SGLang's source, independently of configs/backends.toml. ---
MLA_ONLY = {"dsa", "flashmla", "trtllm_mla", "cutedsl_mla"}
# torch_native/flex_attention read the KV pool per head (their forward, no MLA branch): an
# MLA model dies at its first forward (the H200 record of 0.5.17).
MHA_ONLY = {"llada2_cfg_flashinfer", "trtllm_mha", "hpc_ops", "minicpm_flashattn",
            "minicpm_flashinfer", "torch_native", "flex_attention"}  # fmt: skip
NON_CUDA = {"aiter", "wave", "intel_amx", "ascend", "intel_xpu"}
# Not in the EAGLE draft backend factory's map (speculative/draft_utils.py:96-113).
NO_DRAFT = {"torch_native", "flex_attention", "qsa", "llada2_cfg_flashinfer", "hpc_ops",
            "minicpm_flashattn", "minicpm_flashinfer", "wave"}  # fmt: skip
ALIASES = {"nsa": "dsa", "compressed": "dsv4", "tokenspeed_mla": "cutedsl_mla"}
ALL_NAMES = {
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4", "compressed",
    "fa3", "fa4", "flashinfer", "llada2_cfg_flashinfer", "flashmla", "trtllm_mla",
    "cutedsl_mla", "tokenspeed_mla", "trtllm_mha", "hpc_ops", "minicpm_flashattn",
    "minicpm_flashinfer", "aiter", "wave", "intel_amx", "ascend", "intel_xpu",
}  # fmt: skip


def _canonical(name: str, flag: str) -> str:
    if name == "tokenspeed_mla" and flag == PREFILL:
        return "trtllm_mla"  # serving_hook.py:321-323: cutedsl_mla cannot prefill
    return ALIASES.get(name, name)


def _gpu_ok(name: str, arch: str, sm: int, flag: str) -> bool:
    """Whether SGLang (or the kernel) accepts this SM; SSM models only meet argument checks."""
    args_only = arch == "ssm"
    if name == "fa3":
        return args_only or sm in ({"mla": HOPPER}.get(arch, _span((80, 99))))
    if name == "fa4":
        return args_only or sm in ({"mla": _span((100, 119))}.get(arch, _span((80, 129))))
    if name == "flashmla":
        return args_only or arch == "mha" or sm in HOPPER
    if name == "hpc_ops":
        return args_only or sm in HOPPER
    if name == "trtllm_mla":
        return (args_only and flag in (PREFILL, DRAFT)) or sm in BLACKWELL
    if name == "cutedsl_mla":
        return (args_only and flag == DRAFT) or sm in SM10X
    if name == "trtllm_mha":
        return (args_only and flag == DRAFT) or sm in TRTLLM_MHA
    return True


def expected_fatal(name: str, arch: str, sm: int | None, flag: str) -> set[str]:
    """The kinds of fatal problems SGLang 0.5.23 has with this choice."""
    real = _canonical(name, flag)
    kinds = set()
    if real == "cutedsl_mla" and flag == PREFILL:
        kinds.add("role")  # overrides.py:1242, on any GPU
    if flag == DRAFT and real in NO_DRAFT:
        kinds.add("role")
    builds = arch != "ssm"
    wrong_arch = (real in MLA_ONLY and arch != "mla") or (real in MHA_ONLY and arch != "mha")
    if builds and arch != "unknown" and wrong_arch:
        kinds.add("arch")
    if sm is not None:
        if real in NON_CUDA and builds:
            kinds.add("platform")
        if not _gpu_ok(real, arch, sm, flag):
            kinds.add("gpu")
    return kinds


def test_table_names_are_exactly_the_argparse_choices(table: CompatTable) -> None:
    options = json.loads(config_path("sglang", "options-0.5.23.json").read_text())
    choices = {s: o["choices"] for o in options["options"] for s in o["strings"] if "backend" in s}
    assert set(choices[ATTN]) == set(table.names) == ALL_NAMES
    assert choices[PREFILL] == choices[DECODE] == choices[ATTN]
    assert choices[DRAFT] is None  # validated when the draft worker starts, not by argparse
    assert table.sglang_version == "0.5.23"


@pytest.mark.parametrize("name", sorted(ALL_NAMES))
def test_whole_table_against_the_oracle(table: CompatTable, name: str) -> None:
    for arch in ARCHS:
        for sm in SMS:
            for flag in BACKEND_FLAGS:
                problems = check_backend(table, flag, name, arch=arch, sm=sm)
                got = {p.kind for p in problems if p.fatal}
                assert got == expected_fatal(name, arch, sm, flag), (name, arch, sm, flag)
                deprecated = [p for p in problems if p.kind == "deprecated"]
                assert bool(deprecated) == (name in ALIASES)
                for p in problems:
                    assert (p.flag, p.value) == (flag, name)
                    assert p.reason and p.reason[-1] != "."
                    assert p.source is None or re.search(r"\.py:\d+ \(0\.5\.23\)$", p.source)


def test_cutedsl_mla_on_llama_is_an_arch_problem(table: CompatTable) -> None:
    (p,) = check_backend(table, ATTN, "cutedsl_mla", arch="mha", sm=100)
    assert (p.kind, p.fatal) == ("arch", True)
    assert p.reason == "cutedsl_mla needs an MLA model; this model is MHA"
    assert p.sglang_message == "cutedsl_mla backend can only be used with MLA models."
    assert p.source == "sglang/srt/layers/attention/attention_registry.py:121 (0.5.23)"


def test_cutedsl_mla_on_hopper_fails_the_gpu_check_before_the_model_check(
    table: CompatTable,
) -> None:
    # Seen on the CPU test bed: the argument check fires before the scheduler reads the model.
    gpu, arch = check_backend(table, ATTN, "cutedsl_mla", arch="mha", sm=90)
    assert (gpu.kind, arch.kind) == ("gpu", "arch")
    assert gpu.sglang_message == (
        "CuteDSL MLA backend is only supported on Blackwell GPUs (SM100). "
        "Please use a different backend."
    )
    assert gpu.source == "sglang/srt/arg_groups/overrides.py:1246 (0.5.23)"
    assert check_backend(table, ATTN, "cutedsl_mla", arch="mla", sm=90)[0].kind == "gpu"
    assert check_backend(table, ATTN, "cutedsl_mla", arch="mla", sm=120)[0].kind == "gpu"


def test_cutedsl_mla_is_decode_only(table: CompatTable) -> None:
    (p,) = check_backend(table, PREFILL, "cutedsl_mla", arch="mla", sm=100)
    assert (p.kind, p.fatal) == ("role", True)
    assert p.sglang_message == "CuteDSL MLA only supports decoding for now"
    # Through --attention-backend or --decode-attention-backend SGLang fills prefill itself.
    assert check_backend(table, ATTN, "cutedsl_mla", arch="mla", sm=100) == ()
    assert check_backend(table, DECODE, "cutedsl_mla", arch="mla", sm=103) == ()
    assert table.backend("cutedsl_mla").fill_prefill == "trtllm_mla"  # type: ignore[union-attr]
    # The role assert runs before any GPU check: with no GPU facts it still fails.
    assert [p.kind for p in check_backend(table, PREFILL, "cutedsl_mla", arch="mla", sm=None)] == [
        "role"
    ]


@pytest.mark.parametrize("sm", [100, 103, 120, 121])
def test_trtllm_mla_needs_mla_on_blackwell(table: CompatTable, sm: int) -> None:
    assert check_backend(table, ATTN, "trtllm_mla", arch="mla", sm=sm) == ()
    (p,) = check_backend(table, ATTN, "trtllm_mla", arch="mha", sm=sm)
    assert p.sglang_message == "trtllm_mla backend can only be used with MLA models."


@pytest.mark.parametrize("sm", [80, 89, 90])
def test_trtllm_mla_off_blackwell(table: CompatTable, sm: int) -> None:
    (p,) = check_backend(table, DECODE, "trtllm_mla", arch="mla", sm=sm)
    assert p.kind == "gpu"
    assert "SM100/SM12x" in (p.sglang_message or "")


def test_trtllm_mla_kv_cache_dtype_refuses_the_bfloat16_spelling(table: CompatTable) -> None:
    for kv in ("auto", "bf16", "fp8_e4m3"):
        assert check_backend(table, ATTN, "trtllm_mla", arch="mla", sm=100, kv_cache_dtype=kv) == ()
    (p,) = check_backend(table, ATTN, "trtllm_mla", arch="mla", sm=100, kv_cache_dtype="bfloat16")
    assert (p.kind, p.fatal) == ("kv_cache_dtype", True)
    assert p.sglang_message == (
        "TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto."
    )
    # cutedsl_mla takes both spellings (overrides.py:1248-1253).
    assert (
        check_backend(table, ATTN, "cutedsl_mla", arch="mla", sm=100, kv_cache_dtype="bfloat16")
        == ()
    )
    # SGLang only checks the dtype for --attention-backend / --decode-attention-backend.
    assert (
        check_backend(table, PREFILL, "trtllm_mla", arch="mla", sm=100, kv_cache_dtype="fp8_e5m2")
        == ()
    )


@pytest.mark.parametrize("name", ["trtllm_mha", "hpc_ops"])
def test_trtllm_mha_and_hpc_ops_are_non_mla(table: CompatTable, name: str) -> None:
    (p,) = check_backend(table, ATTN, name, arch="mla", sm=90)
    assert p.kind == "arch"
    assert p.sglang_message == f"{name} backend can only be used with non-MLA models."
    assert check_backend(table, ATTN, name, arch="mha", sm=90) == ()


def test_trtllm_mha_gpu_and_sm120_fp8_prefill(table: CompatTable) -> None:
    (p,) = check_backend(table, ATTN, "trtllm_mha", arch="mha", sm=89)
    assert p.sglang_message is not None and p.sglang_message.startswith(
        "TRTLLM MHA backend for prefill requires"
    )
    (p,) = check_backend(table, DECODE, "trtllm_mha", arch="mha", sm=110)
    assert p.sglang_message is not None and "for decode" in p.sglang_message
    (p,) = check_backend(table, ATTN, "trtllm_mha", arch="mha", sm=120, kv_cache_dtype="fp8_e4m3")
    assert p.kind == "kv_cache_dtype"
    assert (
        check_backend(table, DECODE, "trtllm_mha", arch="mha", sm=120, kv_cache_dtype="fp8_e4m3")
        == ()
    )
    assert (
        check_backend(table, ATTN, "trtllm_mha", arch="mha", sm=100, kv_cache_dtype="fp8_e4m3")
        == ()
    )


def test_fa3_rules(table: CompatTable) -> None:
    for sm in (80, 86, 89, 90):
        assert check_backend(table, ATTN, "fa3", arch="mha", sm=sm) == ()
    assert check_backend(table, ATTN, "fa3", arch="mla", sm=90) == ()
    (p,) = check_backend(table, ATTN, "fa3", arch="mla", sm=86)
    assert p.kind == "gpu" and p.reason == "fa3 needs SM90-SM99 for MLA models; this GPU is SM86"
    (p,) = check_backend(table, ATTN, "fa3", arch="mha", sm=100)
    assert p.sglang_message == (
        "FlashAttention v3 Backend requires SM>=80 and SM<=90. "
        "Please use `--attention-backend flashinfer`."
    )
    assert p.source == "sglang/srt/layers/attention/attention_registry.py:244 (0.5.23)"
    # An unknown arch only fails where no arch would pass.
    assert check_backend(table, ATTN, "fa3", arch="unknown", sm=86) == ()
    assert [p.kind for p in check_backend(table, ATTN, "fa3", arch="unknown", sm=120)] == ["gpu"]
    # fp8_e5m2: SGLang switches to triton itself (a warning, not a failure).
    (p,) = check_backend(table, ATTN, "fa3", arch="mha", sm=90, kv_cache_dtype="fp8_e5m2")
    assert (p.kind, p.fatal) == ("kv_cache_dtype", False)
    assert check_backend(table, DECODE, "fa3", arch="mha", sm=90, kv_cache_dtype="fp8_e5m2") == ()


@pytest.mark.parametrize("name", ["aiter", "ascend", "intel_amx", "wave", "intel_xpu"])
def test_other_platform_backends_on_nvidia(table: CompatTable, name: str) -> None:
    (p,) = [p for p in check_backend(table, ATTN, name, arch="mha", sm=90) if p.fatal]
    assert p.kind == "platform" and "NVIDIA GPU (SM90)" in p.reason
    assert check_backend(table, ATTN, name, arch="mha", sm=None) == ()


def test_platform_messages(table: CompatTable) -> None:
    def message(name: str) -> str | None:
        return check_backend(table, ATTN, name, arch="mha", sm=100)[0].sglang_message

    assert message("ascend") == "No module named 'torch_npu'"
    assert message("aiter") is not None and message("aiter").startswith(  # type: ignore[union-attr]
        "aiter is AMD specific kernel library."
    )


def test_no_nvidia_gpu_fails_cuda_backends_only(table: CompatTable) -> None:
    (p,) = check_backend(table, ATTN, "flashinfer", arch="mha", sm=0)
    assert p.kind == "platform" and p.reason == "flashinfer needs an NVIDIA GPU; this host has none"
    assert check_backend(table, ATTN, "triton", arch="mha", sm=0) == ()
    assert check_backend(table, ATTN, "intel_amx", arch="mha", sm=0) == ()


def test_deprecated_aliases(table: CompatTable) -> None:
    (p,) = check_backend(table, ATTN, "compressed", arch="mha", sm=100)
    assert (p.kind, p.fatal, p.canonical) == ("deprecated", False, "dsv4")
    assert p.sglang_message == "--attention-backend=compressed is deprecated; use 'dsv4' instead."
    assert p.source == "sglang/srt/arg_groups/serving_hook.py:315 (0.5.23)"
    (p,) = check_backend(table, ATTN, "nsa", arch="mla", sm=90)
    assert (p.kind, p.canonical) == ("deprecated", "dsa")
    assert "use 'dsa' instead" in (p.sglang_message or "")
    (p,) = check_backend(table, DECODE, "tokenspeed_mla", arch="mla", sm=100, kv_cache_dtype="auto")
    assert p.canonical == "cutedsl_mla" and "sets --kv-cache-dtype fp8_e4m3" in p.reason
    # On the prefill side SGLang renames it twice: to cutedsl_mla, then to trtllm_mla.
    (p,) = check_backend(table, PREFILL, "tokenspeed_mla", arch="mla", sm=100)
    assert p.canonical == "trtllm_mla"
    assert p.sglang_message == (
        "--prefill-attention-backend=tokenspeed_mla is deprecated; use 'cutedsl_mla' instead."
    )
    # The alias keeps its target's constraints, and the forced FP8 KV cache passes them.
    kinds = [
        p.kind
        for p in check_backend(
            table, ATTN, "tokenspeed_mla", arch="mha", sm=90, kv_cache_dtype="fp8_e5m2"
        )
    ]
    assert kinds == ["deprecated", "gpu", "arch"]


def test_unknown_backend(table: CompatTable) -> None:
    (p,) = check_backend(table, ATTN, "cutlass_mla", arch="mla", sm=100)
    assert (p.kind, p.fatal) == ("unknown_backend", True)
    assert p.sglang_message is not None
    assert p.sglang_message.startswith(
        "argument --attention-backend: invalid choice: 'cutlass_mla' (choose from 'triton',"
    )
    (p,) = check_backend(table, DRAFT, "cutlass_mla", arch="mla", sm=100)
    assert p.sglang_message == "Invalid attention backend: cutlass_mla"


def test_draft_backends(table: CompatTable) -> None:
    (p,) = check_backend(table, DRAFT, "hpc_ops", arch="mha", sm=90)
    assert p.kind == "role"
    assert p.sglang_message == "EAGLE is not supported in decode attention backend hpc_ops"
    # EAGLE takes trtllm_mla; DFLASH would fall back to flashinfer: a warning.
    (p,) = check_backend(table, DRAFT, "trtllm_mla", arch="mla", sm=100)
    assert (p.kind, p.fatal) == ("role", False)
    problems = check_backend(table, DRAFT, "trtllm_mla", arch="mha", sm=100)
    assert [(p.kind, p.fatal) for p in problems] == [("role", False), ("arch", True)]


def test_ssm_models_only_meet_argument_checks(table: CompatTable) -> None:
    assert check_backend(table, ATTN, "fa3", arch="ssm", sm=120) == ()
    assert check_backend(table, ATTN, "aiter", arch="ssm", sm=90) == ()
    (p,) = check_backend(table, ATTN, "trtllm_mla", arch="ssm", sm=90)
    assert p.kind == "gpu"


def test_check_backend_is_a_function_of_its_inputs(table: CompatTable) -> None:
    args = dict(arch="mha", sm=90, kv_cache_dtype="bfloat16")
    first = check_backend(table, ATTN, "cutedsl_mla", **args)  # type: ignore[arg-type]
    assert check_backend(table, ATTN, "cutedsl_mla", **args) == first  # type: ignore[arg-type]
    assert all(isinstance(p, Problem) for p in first)


def test_bad_inputs_are_refused(table: CompatTable) -> None:
    with pytest.raises(InputError, match="--mm-attention-backend"):
        check_backend(table, "--mm-attention-backend", "fa3", arch="mha", sm=90)
    with pytest.raises(InputError, match="'gqa'"):
        check_backend(table, ATTN, "fa3", arch="gqa", sm=90)


@pytest.mark.parametrize(
    "case",
    [
        (ATTN, "mla", 100, None, "trtllm_mla"),
        (ATTN, "mla", 103, "bfloat16", "flashinfer"),
        (ATTN, "mla", 90, None, "fa3"),
        (ATTN, "mla", 120, None, "triton"),
        (ATTN, "mla", 86, None, "triton"),
        (ATTN, "mha", 90, None, "fa3"),
        (ATTN, "mha", 90, "fp8_e5m2", "flashinfer"),
        (ATTN, "mha", 100, None, "trtllm_mha"),
        (ATTN, "mha", 120, None, "flashinfer"),
        (ATTN, "mha", 86, None, "flashinfer"),
        (ATTN, "ssm", 100, None, "trtllm_mha"),
        (ATTN, "unknown", 90, None, "flashinfer"),
        (ATTN, "mha", None, None, "triton"),
        (ATTN, "mha", 0, None, "triton"),
        (PREFILL, "mla", 100, None, "trtllm_mla"),
        (DECODE, "mha", 120, "fp8_e4m3", "flashinfer"),
        (DRAFT, "mla", 100, None, "flashinfer"),
    ],
)
def test_best_fit(table: CompatTable, case: tuple[str, str, int | None, str | None, str]) -> None:
    flag, arch, sm, kv, want = case
    fit = best_fit(table, flag, arch=arch, sm=sm, kv_cache_dtype=kv)
    assert fit is not None and fit[0] == want
    assert ".py:" in fit[1]
    assert not [
        p for p in check_backend(table, flag, want, arch=arch, sm=sm, kv_cache_dtype=kv) if p.fatal
    ]


def test_best_fit_says_what_it_passed_over(table: CompatTable) -> None:
    fit = best_fit(table, ATTN, arch="mla", sm=100, kv_cache_dtype="bfloat16")
    assert fit is not None and "passed over trtllm_mla" in fit[1]


# --- the TOML itself ---------------------------------------------------------------

GOOD = config_path("backends.toml").read_text(encoding="utf-8")


def test_default_table_parses_from_text() -> None:
    # The shipped table is the view for the release it was read from (issue 11).
    assert parse_table(GOOD, "x.toml").for_release("0.5.23", None) == load_default_table()


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('sglang_version = "0.5.23"\n', "", "meta.sglang_version"),
        ('summary = "FlashAttention 3 (sgl-kernel)"\n', "", "backends.fa3.summary"),
        ("sms = [[80, 99]]", 'sms = "80-99"', "backends.fa3.constraints[0].sms"),
        ("sms = [[80, 99]]", "sms = [[99, 80]]", "backends.fa3.constraints[0].sms[0]"),
        (
            'platform = "cuda"\n\n[[backends.fa3',
            "platform = 3\n\n[[backends.fa3",
            "backends.fa3.platform",
        ),
        (
            'kind = "arch"\narchs = ["mla"]',
            'kind = "arch"\narchs = ["gqa"]',
            "backends.dsa.constraints[0].archs[0]",
        ),
        ('alias_of = "dsv4"', 'alias_of = "dsv5"', "backends.compressed.alias_of"),
        (
            'fatal = false\nmessage = "FlashAttention3',
            'fatal = 0\nmessage = "FlashAttention3',
            "backends.fa3.constraints[2].fatal",
        ),
        (
            'kind = "model_arch"\narchitectures = ["DeepseekV4ForCausalLM"',
            'kind = "model_arch"\nfoo = ["DeepseekV4ForCausalLM"',
            "backends.dsv4.constraints[0].architectures",
        ),
        ('sms = [[100, 129]]\nmessage = "--kv-cache-dtype mxfp8', 'sms = [[129, 100]]\n'
         'message = "--kv-cache-dtype mxfp8', "kv_sm[0].sms[0]"),
        (
            'candidates = ["fa3", "flashinfer", "triton"]',
            'candidates = ["fa3", "fa5"]',
            "rewrite_preference[0].candidates",
        ),
    ],
)
def test_bad_toml_names_the_key(old: str, new: str, key: str) -> None:
    assert old in GOOD
    with pytest.raises(ConfigError) as info:
        parse_table(GOOD.replace(old, new, 1), "configs/backends.toml")
    assert (info.value.path, info.value.key) == ("configs/backends.toml", key)
    assert str(info.value).startswith(f"configs/backends.toml: {key}: ")


def test_not_toml_at_all() -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_table("[meta\n", "b.toml")
