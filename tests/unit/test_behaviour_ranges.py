"""A backend constraint holds wherever the release's code cannot run the combination.

Issue 19 item 4 and the real H200 record of SGLang 0.5.17 (issue 23): the ranges used to be
where a *message* appears, so 0.5.17 kept lines that died on the GPU. Each case here is a line
0.5.17 ran on an H200 (SM 9.0): the deaths must be changed before launch, the lines that
served must pass unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from packaging.specifiers import SpecifierSet

from sglang_guard.cli import main
from sglang_guard.preflight.compat import Problem, check_backend
from sglang_guard.preflight.compat_table import load_raw_table
from sglang_guard.rules.rules import MatchContext, Matcher, first_fix, load_default_pack
from sglang_guard.sglang.releases import known_releases, load_release

REPO = Path(__file__).resolve().parents[2]
LLAMA = str(REPO / "configs" / "models" / "tiny-llama")
DSV3 = str(REPO / "configs" / "models" / "tiny-deepseek-v3")
GPT_OSS = str(REPO / "tests" / "data" / "h200-models" / "gpt-oss-20b")


def check(release: str, sm: str, *argv: str) -> dict[str, Any]:
    res = CliRunner().invoke(main, ["check", "--json", "--gpu-sm", sm, "--sglang-version",
                                    release, "--", *argv], catch_exceptions=False)
    assert res.exit_code in (0, 1, 78), res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


# Died on the H200 with 0.5.17 (sglang-on-the-h200 / gpu-launch README, issue 19 "Why").
DIED_0517 = [
    (LLAMA, "flashmla"),  # AttributeError: 'ModelConfig' object has no attribute 'kv_lora_rank'
    (LLAMA, "cutlass_mla"),  # the same AttributeError
    (DSV3, "cutlass_mla"),  # cutlass_mla_decode is only supported on compute capability 10.0
    (LLAMA, "intel_amx"),
    (LLAMA, "wave"),
    (LLAMA, "ascend"),
    (LLAMA, "intel_xpu"),
    (LLAMA, "dual_chunk_flash_attn"),
    (DSV3, "intel_amx"),
    (DSV3, "ascend"),
    (DSV3, "torch_native"),  # shape errors: an MHA-only backend on MLA
    (DSV3, "flex_attention"),
]


@pytest.mark.parametrize(("model", "backend"), DIED_0517,
                         ids=[f"{Path(m).name}-{b}" for m, b in DIED_0517])
def test_what_died_on_the_h200_is_dropped_on_0_5_17(model: str, backend: str) -> None:
    out = check("0.5.17", "90", "--model-path", model, "--attention-backend", backend)
    assert out["verdict"] == "remediated", out
    assert "--attention-backend" not in out["argv_out"]
    finding = out["findings"][0]
    assert finding["action"] == "drop"
    # The finding cites 0.5.17's own source, not 0.5.23's line.
    assert finding["source"] and "0.5.17" in finding["source"], finding


def test_flashmla_on_a_llama_cites_0_5_17s_line_and_no_foreign_message() -> None:
    out = check("0.5.17", "90", "--model-path", LLAMA, "--attention-backend", "flashmla")
    finding = out["findings"][0]
    assert finding["kind"] == "arch"
    assert finding["source"].startswith("sglang/srt/layers/attention/flashmla_backend.py:84")


def test_cutlass_mla_on_sm90_is_dropped_and_sm100_keeps_it() -> None:
    out = check("0.5.17", "90", "--model-path", DSV3, "--attention-backend", "cutlass_mla")
    assert out["findings"][0]["kind"] == "gpu"
    assert "SM100" in out["findings"][0]["reason"]
    ok = check("0.5.17", "100", "--model-path", DSV3, "--attention-backend", "cutlass_mla")
    assert ok["verdict"] == "ok", ok


# Served on the H200 with 0.5.17: must pass unchanged.
SERVED_0517 = [
    (LLAMA, ()),
    (LLAMA, ("--attention-backend", "fa3")),
    (LLAMA, ("--attention-backend", "triton")),
    (LLAMA, ("--attention-backend", "torch_native")),
    (LLAMA, ("--attention-backend", "flex_attention")),
    (LLAMA, ("--prefill-attention-backend", "fa3", "--decode-attention-backend", "triton")),
    (LLAMA, ("--attention-backend", "triton", "--kv-cache-dtype", "fp8_e4m3")),
    (DSV3, ()),
    (DSV3, ("--attention-backend", "fa3")),
    (DSV3, ("--attention-backend", "flashinfer")),
    (DSV3, ("--attention-backend", "triton")),
    (DSV3, ("--attention-backend", "flashmla")),
    (DSV3, ("--prefill-attention-backend", "fa3", "--decode-attention-backend", "triton")),
    (DSV3, ("--prefill-attention-backend", "fa3", "--decode-attention-backend", "flashmla")),
    (DSV3, ("--attention-backend", "triton", "--kv-cache-dtype", "fp8_e4m3")),
    (DSV3, ("--attention-backend", "flashinfer", "--kv-cache-dtype", "fp8_e4m3")),
]


@pytest.mark.parametrize(("model", "flags"), SERVED_0517,
                         ids=[f"{Path(m).name}-{'-'.join(f) or 'default'}"
                              for m, f in SERVED_0517])
def test_what_served_on_the_h200_passes_unchanged(model: str, flags: tuple[str, ...]) -> None:
    argv = ["--model-path", model, *flags]
    out = check("0.5.17", "90", *argv)
    assert out["verdict"] == "ok", out
    assert out["argv_out"] == argv


def test_a_check_whose_behaviour_a_release_does_not_confirm_warns() -> None:
    """Outside a constraint's range (and with no newer form of it in that release) the check
    stays, as a warning that says so; nothing is dropped and nothing is silent."""
    table = load_raw_table().for_release("0.5.8", None)
    backend = table.backend("trtllm_mla")
    assert backend is not None
    gpu = [c for c in backend.constraints if c.kind == "gpu"]
    assert gpu, "the SM check of trtllm_mla vanished on 0.5.8"
    assert all(not c.fatal and c.unconfirmed for c in gpu)
    out = check("0.5.8", "90", "--model-path", DSV3, "--attention-backend", "trtllm_mla")
    assert out["argv_out"][-1] == "trtllm_mla"
    assert any("not confirmed" in w and "trtllm_mla" in w for w in out["warnings"]), out


def test_gpt_oss_allow_list_of_the_oldest_releases() -> None:
    """fa4 joined in 0.5.3.post1 (server_args.py:782); 0.5.3's list is [triton, trtllm_mha,
    fa3] (server_args.py:742), asserted on --attention-backend alone."""
    def problems(release: str, flag: str, value: str) -> tuple[Problem, ...]:
        table = load_raw_table().for_release(release, None)
        return check_backend(table, flag, value, arch="mha", sm=100,
                             architecture="GptOssForCausalLM")
    assert [p.kind for p in problems("0.5.3", "--attention-backend", "fa4")] == ["model"]
    assert problems("0.5.3", "--attention-backend", "fa4")[0].source == (
        "sglang/srt/server_args.py:742 (0.5.3)")
    assert problems("0.5.3.post1", "--attention-backend", "fa4") == ()
    assert problems("0.5.3", "--prefill-attention-backend", "flashinfer") == ()
    assert [p.kind for p in problems("0.5.3.post1", "--prefill-attention-backend",
                                     "flashinfer")] == ["model"]
    assert problems("0.5.23", "--speculative-draft-attention-backend", "flashinfer") == ()


def test_gpt_oss_allow_list_per_release() -> None:
    out = check("0.5.17", "90", "--model-path", GPT_OSS, "--attention-backend", "flashinfer")
    assert out["verdict"] == "remediated", out
    finding = out["findings"][0]
    assert finding["kind"] == "model"
    assert "GptOssForCausalLM requires one of" in (finding["sglang_message"] or "")
    assert finding["source"].startswith("sglang/srt/server_args.py:5334")
    # ascend joined the list in 0.5.8 (server_args.py:1267).
    assert check("0.5.8", "none", "--model-path", GPT_OSS,
                 "--attention-backend", "ascend")["verdict"] == "ok"
    old = check("0.5.7", "none", "--model-path", GPT_OSS, "--attention-backend", "ascend")
    assert old["verdict"] == "remediated", old
    assert old["findings"][0]["source"].startswith("sglang/srt/server_args.py:1173")
    split = check("0.5.17", "90", "--model-path", GPT_OSS, "--decode-attention-backend",
                  "flashinfer")
    assert split["findings"][0]["flag"] == "--decode-attention-backend"
    for backend in ("triton", "fa3"):
        assert check("0.5.17", "90", "--model-path", GPT_OSS,
                     "--attention-backend", backend)["verdict"] == "ok"


def test_cutlass_mla_kernel_message_has_a_rule() -> None:
    """The kernel's message (198 s into a launch on the H200) drops the flag, on the releases
    that offer cutlass_mla; another flag's value is left alone."""
    matcher = Matcher([load_default_pack()])
    line = ("RuntimeError: cutlass_mla_decode is only supported on compute capability 10.0, "
            "but found sm version 90")
    table = load_release("0.5.17").options
    flags: dict[str, str | None] = {"--attention-backend": "cutlass_mla"}
    fix = first_fix(matcher, line, MatchContext(flags, "mla", 90, "0.5.17", table), {})[0]
    assert fix is not None and fix.rule.id == "cutlass-mla-requires-sm100"
    assert (fix.action, fix.flag, fix.old_value) == ("drop_flag", "--attention-backend",
                                                     "cutlass_mla")
    split: dict[str, str | None] = {"--attention-backend": "fa3",
                                    "--decode-attention-backend": "cutlass_mla"}
    fix = first_fix(matcher, line, MatchContext(split, "mla", 90, "0.5.17", table), {})[0]
    assert fix is not None and fix.flag == "--decode-attention-backend"


@pytest.mark.parametrize(("release", "sm", "model", "flags", "changed"), [
    # nvfp4 KV needs SM10x or SM12x (0.5.17 server_args.py:5866).
    ("0.5.17", "90", LLAMA, ("--kv-cache-dtype", "nvfp4"), "--kv-cache-dtype"),
    ("0.5.17", "120", LLAMA, ("--kv-cache-dtype", "nvfp4"), None),
    ("0.5.17", "100", LLAMA, ("--kv-cache-dtype", "nvfp4"), None),
    # fp4_mx_block16 has no SM check of its own.
    ("0.5.17", "90", LLAMA, ("--kv-cache-dtype", "fp4_mx_block16",
                             "--attention-backend", "triton"), None),
    # One backend on both sides must be on the arch's KV4 list.
    ("0.5.17", "100", LLAMA, ("--kv-cache-dtype", "nvfp4", "--attention-backend",
                              "flashinfer"), "--attention-backend"),
    ("0.5.17", "100", DSV3, ("--kv-cache-dtype", "nvfp4", "--attention-backend",
                             "flashmla"), "--attention-backend"),
    ("0.5.17", "100", DSV3, ("--kv-cache-dtype", "nvfp4", "--attention-backend",
                             "trtllm_mla"), None),
    # cutlass_mla left the MLA list with the backend (0.5.19 has it, 0.5.20 no longer).
    ("0.5.19", "100", DSV3, ("--kv-cache-dtype", "nvfp4", "--attention-backend",
                             "cutlass_mla"), None),
    # Before 0.5.16 the KV4 dtype was fp4_e2m1, and flashmla was on the MLA list.
    ("0.5.10", "100", DSV3, ("--kv-cache-dtype", "fp4_e2m1", "--attention-backend",
                             "flashmla"), None),
    ("0.5.10", "100", LLAMA, ("--kv-cache-dtype", "fp4_e2m1", "--attention-backend",
                              "flashinfer"), "--attention-backend"),
    # 0.5.21 on: SGLang resolves NVFP4's prefill itself (handle_nvfp4_prefill_kv_dequant_dtype,
    # kv_cache_hook.py): flashinfer (FP8 workspace) or trtllm_mha (native, SM100 only), and
    # decode on trtllm_mha; the KV4 list no longer applies to nvfp4 there.
    ("0.5.23", "100", LLAMA, ("--kv-cache-dtype", "nvfp4", "--attention-backend",
                              "flashinfer"), None),
    ("0.5.23", "100", LLAMA, ("--kv-cache-dtype", "nvfp4", "--attention-backend",
                              "trtllm_mha"), None),
    ("0.5.23", "120", LLAMA, ("--kv-cache-dtype", "nvfp4"), None),
    ("0.5.23", "100", LLAMA, ("--kv-cache-dtype", "nvfp4", "--attention-backend",
                              "triton"), "--attention-backend"),
    ("0.5.23", "120", LLAMA, ("--kv-cache-dtype", "nvfp4", "--attention-backend",
                              "trtllm_mha"), "--attention-backend"),
    ("0.5.23", "100", LLAMA, ("--kv-cache-dtype", "nvfp4", "--decode-attention-backend",
                              "flashinfer"), "--decode-attention-backend"),
    ("0.5.20", "100", LLAMA, ("--kv-cache-dtype", "nvfp4", "--attention-backend",
                              "flashinfer"), "--attention-backend"),
    ("0.5.23", "100", LLAMA, ("--kv-cache-dtype", "fp4_mx_block16", "--attention-backend",
                              "flashinfer"), "--attention-backend"),
    # Split backends: SGLang only warns, so nothing changes.
    ("0.5.17", "100", LLAMA, ("--kv-cache-dtype", "nvfp4", "--prefill-attention-backend",
                              "flashinfer", "--decode-attention-backend", "trtllm_mha"), None),
])
def test_fp4_kv_cache_checks_per_release(release: str, sm: str, model: str,
                                         flags: tuple[str, ...], changed: str | None) -> None:
    argv = ["--model-path", model, *flags]
    out = check(release, sm, *argv)
    if changed is None:
        assert (out["verdict"], out["argv_out"]) == ("ok", argv), out
        return
    assert out["verdict"] == "remediated", out
    finding = next(f for f in out["findings"] if f["flag"] == changed)
    assert finding["action"] == "drop"
    assert finding["source"].endswith(f"({release})")
    assert changed not in out["argv_out"]


def test_fp4_kv_backend_off_the_list_is_rewritten_to_a_listed_one_under_rewrite() -> None:
    res = CliRunner().invoke(main, ["check", "--json", "--policy", "rewrite", "--gpu-sm", "100",
                                    "--sglang-version", "0.5.17", "--", "--model-path", LLAMA,
                                    "--kv-cache-dtype", "nvfp4", "--attention-backend",
                                    "flashinfer"], catch_exceptions=False)
    out = json.loads(res.stdout)
    finding = out["findings"][0]
    assert (finding["action"], finding["new_value"]) == ("rewrite", "triton"), out
    assert "KV4 MHA expects attention_backend to be one of" in finding["sglang_message"]


def test_dsa_needs_a_dsa_checkpoint(tmp_path: Path) -> None:
    """is_deepseek_dsa (model_config.py) asks for index_topk; a plain DeepSeek-V3 fails
    "DSA backend only supports DeepSeek DSA" (dsa_backend.py:311 in 0.5.17)."""
    plain = check("0.5.17", "90", "--model-path", DSV3, "--attention-backend", "dsa")
    finding = plain["findings"][0]
    assert (finding["kind"], finding["action"]) == ("model_field", "drop"), plain
    assert finding["source"] == "sglang/srt/layers/attention/dsa_backend.py:311 (0.5.17)"
    assert finding["sglang_message"] == "DSA backend only supports DeepSeek DSA"
    config = json.loads((Path(DSV3) / "config.json").read_text(encoding="utf-8"))
    (tmp_path / "config.json").write_text(json.dumps({**config, "index_topk": 2048}),
                                          encoding="utf-8")
    dsa = check("0.5.17", "90", "--model-path", str(tmp_path), "--attention-backend", "dsa")
    assert dsa["verdict"] == "ok", dsa


def test_dual_chunk_backend_keeps_a_model_that_has_its_config() -> None:
    qwen = str(REPO / "tests" / "data" / "documented-models" / "qwen2.5-14b-instruct-1m")
    out = check("0.5.17", "90", "--model-path", qwen, "--attention-backend",
                "dual_chunk_flash_attn")
    assert out["verdict"] == "ok", out


def test_no_check_vanishes_silently_on_any_release() -> None:
    """On every shipped release, each constraint of a backend the release offers either acts,
    warns that the release does not confirm it, or gives way to another form of the same
    check that the release holds (a reworded or widened check)."""
    raw = load_raw_table()
    gave_way = unconfirmed = 0
    for release in known_releases():
        names = load_release(release).choices.get("attention_backend", ())
        table = raw.for_release(release, tuple(names))
        for backend in table.backends:
            source = next((b for b in raw.backends if b.name == backend.name
                           and b.alias is None and b.constraints
                           and _holds_spec(b.sglang, release)), None)
            if source is None:
                continue
            kept = {c.key for c in backend.constraints}
            unconfirmed += sum(c.unconfirmed and not c.fatal for c in backend.constraints)
            for c in source.constraints:
                if c.key in kept:
                    continue
                gave_way += 1
                assert any(o.key in kept and o.kind == c.kind and set(o.slots) & set(c.slots)
                           for o in source.constraints if o is not c), (release, c.key)
    assert gave_way and unconfirmed  # trtllm_mha's reworded SM check; older releases' checks


def _holds_spec(spec: str, release: str) -> bool:
    return not spec or SpecifierSet(spec).contains(release, prereleases=True)


def test_a_cached_shape_from_another_guard_version_is_read() -> None:
    from sglang_guard.preflight.facts import ModelShape  # noqa: PLC0415

    shape = ModelShape.from_dict({"num_attention_heads": 4, "dual_chunk_attention": True,
                                  "config_fields": ["index_topk"]})
    assert shape is not None and shape.config_fields == ("index_topk",)
