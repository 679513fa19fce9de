"""Two deaths of the H200 record (SGLang 0.5.17, SM 9.0) that preflight now knows.

- `--attention-backend dsv4` (and its alias `compressed`) on a Llama and on a DeepSeek-V3
  died building DeepseekV4AttnBackend: it asserts a DeepSeek V4 head (head_dim 512) and a
  DeepSeekV4TokenToKVPool, which SGLang builds only for a DeepSeek V4 architecture
  (is_deepseek_v4, configs/model_config.py). Every release that has the backend (0.5.12 on).
- `--kv-cache-dtype mxfp8` died in the argument phase on SM90: SGLang asks for
  is_blackwell_supported (compute major 10, 11 or 12). Every release that takes the dtype
  (0.5.16 on).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from packaging.version import Version

from sglang_guard.cli import main
from sglang_guard.preflight.compat import check_kv_sm
from sglang_guard.preflight.compat_table import confirmed_only, load_raw_table
from sglang_guard.sglang.releases import known_releases, load_release

REPO = Path(__file__).resolve().parents[2]
LLAMA = str(REPO / "configs" / "models" / "llama-hd128")
DSV3 = str(REPO / "configs" / "models" / "dsv3-mla576")
TINY_LLAMA = str(REPO / "configs" / "models" / "tiny-llama")
# A DeepSeek V4 config with the fields SGLang's model_config reads for it (the
# DeepseekV4ForCausalLM branch of _derive_model_shapes: head_dim, qk_rope_head_dim,
# sliding_window, index_head_dim, compress_ratios; head_dim 512 = 448 + 64 as the backend
# asserts).
V4_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "hidden_size": 4096, "num_attention_heads": 64, "num_key_value_heads": 1,
    "head_dim": 512, "qk_rope_head_dim": 64, "index_head_dim": 128, "index_n_heads": 64,
    "index_topk": 512, "sliding_window": 128, "compress_ratios": [0, 4, 128, 4],
    "num_hidden_layers": 4, "intermediate_size": 2048, "moe_intermediate_size": 2048,
    "vocab_size": 129280, "max_position_embeddings": 65536, "rope_theta": 10000,
    "torch_dtype": "bfloat16",
}


def check(release: str, sm: str, *argv: str) -> dict[str, Any]:
    res = CliRunner().invoke(main, ["check", "--json", "--gpu-sm", sm, "--sglang-version",
                                    release, "--", *argv], catch_exceptions=False)
    assert res.exit_code in (0, 1, 78), res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def _releases_with(choice: str, dest: str) -> list[str]:
    return [v for v in known_releases() if choice in load_release(v).choices.get(dest, ())]


DSV4_RELEASES = _releases_with("dsv4", "attention_backend")


def test_dsv4_is_a_backend_of_0_5_12_on() -> None:
    assert DSV4_RELEASES and min(DSV4_RELEASES, key=Version) == "0.5.12"
    backend = load_raw_table().backend("dsv4")
    assert backend is not None
    rule = next(c for c in backend.constraints if c.kind == "model_arch")
    assert rule.sglang == ">=0.5.12"


@pytest.mark.parametrize("release", DSV4_RELEASES)
@pytest.mark.parametrize("model", [LLAMA, DSV3], ids=["llama", "dsv3"])
def test_dsv4_on_a_model_that_is_no_deepseek_v4_is_dropped(release: str, model: str) -> None:
    argv = ["--model-path", model, "--attention-backend", "dsv4"]
    out = check(release, "90", *argv)
    assert out["verdict"] == "remediated", out
    finding = next(f for f in out["findings"] if f["flag"] == "--attention-backend")
    assert (finding["kind"], finding["action"]) == ("model_arch", "drop"), out
    assert finding["source"].startswith("sglang/srt/layers/attention/deepseek_v4_backend.py:")
    assert finding["source"].endswith(f"({release})")
    assert "--attention-backend" not in out["argv_out"]


def test_dsv4_drop_cites_0_5_17s_line_and_its_assert_message() -> None:
    out = check("0.5.17", "90", "--model-path", LLAMA, "--attention-backend", "dsv4")
    finding = out["findings"][0]
    assert finding["source"] == "sglang/srt/layers/attention/deepseek_v4_backend.py:509 (0.5.17)"
    assert finding["sglang_message"] == (
        "DSV4 MQA head_dim = qk_nope_head_dim(448) + qk_rope_head_dim(64) = 512")


@pytest.mark.parametrize("model", [LLAMA, DSV3], ids=["llama", "dsv3"])
def test_the_compressed_alias_is_dropped_the_same_way(model: str) -> None:
    out = check("0.5.17", "90", "--model-path", model, "--attention-backend", "compressed")
    assert out["verdict"] == "remediated", out
    assert any(f["kind"] == "model_arch" and f["action"] == "drop" for f in out["findings"])


@pytest.mark.parametrize("release", DSV4_RELEASES)
@pytest.mark.parametrize("sm", ["90", "100"])
def test_dsv4_keeps_a_deepseek_v4_model(tmp_path: Path, release: str, sm: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(V4_CONFIG), encoding="utf-8")
    argv = ["--model-path", str(tmp_path), "--attention-backend", "dsv4"]
    out = check(release, sm, *argv)
    assert (out["verdict"], out["argv_out"]) == ("ok", argv), out


MXFP8_RELEASES = _releases_with("mxfp8", "kv_cache_dtype")


def test_mxfp8_is_a_kv_dtype_of_0_5_16_on() -> None:
    assert MXFP8_RELEASES and min(MXFP8_RELEASES, key=Version) == "0.5.16"


@pytest.mark.parametrize("release", MXFP8_RELEASES)
@pytest.mark.parametrize("sm", ["80", "89", "90"])
def test_mxfp8_below_blackwell_is_dropped(release: str, sm: str) -> None:
    argv = ["--model-path", TINY_LLAMA, "--attention-backend", "triton",
            "--kv-cache-dtype", "mxfp8"]
    out = check(release, sm, *argv)
    assert out["verdict"] == "remediated", out
    (finding,) = out["findings"]
    assert (finding["flag"], finding["action"], finding["kind"]) == (
        "--kv-cache-dtype", "drop", "gpu"), out
    assert finding["source"].endswith(f"({release})")
    assert finding["sglang_message"].startswith("--kv-cache-dtype mxfp8 requires an SM100+")
    assert out["argv_out"] == argv[:4]


def test_mxfp8_drop_cites_0_5_17s_line() -> None:
    out = check("0.5.17", "90", "--model-path", LLAMA, "--attention-backend", "triton",
                "--kv-cache-dtype", "mxfp8")
    assert out["findings"][0]["source"] == "sglang/srt/server_args.py:5847 (0.5.17)"


@pytest.mark.parametrize("release", MXFP8_RELEASES)
@pytest.mark.parametrize("sm", ["100", "103", "120"])
def test_mxfp8_on_blackwell_is_kept(release: str, sm: str) -> None:
    argv = ["--model-path", TINY_LLAMA, "--kv-cache-dtype", "mxfp8"]
    out = check(release, sm, *argv)
    assert (out["verdict"], out["argv_out"]) == ("ok", argv), out


def test_a_release_without_the_check_only_warns() -> None:
    """A kv_sm entry that a release's source does not confirm warns, never drops."""
    table = load_raw_table().for_release("0.5.17", None)
    unconfirmed = replace(table, kv_sm=tuple(replace(k, source=None) for k in table.kv_sm))
    (problem,) = check_kv_sm(unconfirmed, kv="mxfp8", sm=90)
    assert not problem.fatal and "a warning only" in problem.reason
    (confirmed,) = check_kv_sm(table, kv="mxfp8", sm=90)
    assert confirmed.fatal
    assert check_kv_sm(table, kv="fp8_e4m3", sm=90) == ()
    # no GPU facts (None) or no NVIDIA GPU (0: the platform is not known): not judged
    assert check_kv_sm(table, kv="mxfp8", sm=None) == check_kv_sm(table, kv="mxfp8", sm=0) == ()


def test_a_newer_release_keeps_the_mxfp8_check_only_where_its_source_has_it() -> None:
    """A release newer than the tables (confirmed_only): the check acts where the installed
    source still raises SGLang's message, and only warns where it does not."""
    table = load_raw_table().for_release("0.5.23", None)
    (rule,) = table.kv_sm
    said, _, _ = confirmed_only(table, f"raise ValueError({rule.message!r})")
    assert [p.fatal for p in check_kv_sm(said, kv="mxfp8", sm=90)] == [True]
    silent, _, _ = confirmed_only(table, "def handle_kv4_compatibility(): pass")
    assert [p.fatal for p in check_kv_sm(silent, kv="mxfp8", sm=90)] == [False]
