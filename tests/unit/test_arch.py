"""Attention arch classification, against expectations read from SGLang 0.5.23's model_config.py."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_guard.errors import ConfigError
from sglang_guard.preflight.arch import (
    ArchTable,
    classify,
    draft_architectures,
    load_default_arch_table,
    parse_arch_table,
)
from sglang_guard.preflight.shell.modelprobe import arch_table


@pytest.fixture(scope="module")
def table() -> ArchTable:
    return load_default_arch_table()


# (architectures, text-config fields, expected) -- written from _derive_model_shapes
# (sglang/srt/configs/model_config.py:1331-1542), not from configs/attention-arch.toml.
CASES: list[tuple[list[str], dict[str, Any], str]] = [
    (["LlamaForCausalLM"], {}, "mha"),
    (["LlamaForCausalLM"], {"kv_lora_rank": 512}, "mha"),  # the field alone is not MLA
    (["Qwen2ForCausalLM"], {"kv_lora_rank": 512, "use_mla": True}, "mha"),
    (["DeepseekV2ForCausalLM"], {}, "mla"),
    (["DeepseekV3ForCausalLM"], {}, "mla"),
    (["DeepseekV32ForCausalLM"], {}, "mla"),
    (["DeepseekV3ForCausalLMNextN"], {}, "mla"),
    (["KimiK25ForConditionalGeneration"], {}, "mla"),
    (["MistralLarge3ForCausalLM"], {}, "mla"),
    (["Glm5NextForConditionalGeneration"], {}, "mla"),
    (["PixtralForConditionalGeneration"], {}, "mha"),
    (["PixtralForConditionalGeneration"], {"kv_lora_rank": None}, "mha"),
    (["PixtralForConditionalGeneration"], {"kv_lora_rank": 512}, "mla"),
    (["PixtralForConditionalGeneration"], {"kv_lora_rank": 0}, "mla"),  # `is not None`
    (["DeepseekV4ForCausalLM"], {"kv_lora_rank": 512}, "mha"),
    (["DeepseekV4ForCausalLMDSpark"], {}, "mha"),
    (["Glm4MoeForCausalLMNextN"], {}, "mha"),
    (["Glm4MoeForCausalLM"], {}, "mha"),
    (["MiniCPM3ForCausalLM"], {}, "mla"),
    (["DeepseekVL2ForCausalLM"], {}, "mla"),  # getattr(text, "use_mla", True)
    (["DeepseekVL2ForCausalLM"], {"use_mla": True}, "mla"),
    (["DeepseekVL2ForCausalLM"], {"use_mla": False}, "mha"),
    (["DeepseekVL2ForCausalLM"], {"use_mla": None}, "mha"),
    (["KimiVLForConditionalGeneration"], {}, "mla"),
    (["KimiLinearForCausalLM"], {}, "mla"),
    (["KimiK3ForConditionalGeneration"], {}, "mla"),
    (["BailingMoeV2_5ForCausalLM"], {}, "mla"),
    (["BailingMoeForCausalLMNextN"], {}, "mha"),
    (["BailingMoeForCausalLMNextN"], {"kv_lora_rank": 64}, "mla"),
    (["BailingMoeV2ForCausalLM"], {"kv_lora_rank": 64}, "mha"),
    (["BailingMoeV3ForCausalLM"], {}, "mla"),
    (["BailingMoeV3VLForConditionalGeneration"], {}, "mla"),
    (["SarvamMLAForCausalLM"], {}, "mla"),
    (["Mamba2ForCausalLM"], {}, "ssm"),
    (["MambaForCausalLM"], {}, "ssm"),
    (["FalconMambaForCausalLM"], {}, "ssm"),
    (["NemotronHForCausalLM"], {}, "mha"),  # hybrid, not pure SSM
    # membership anywhere in the list counts, and the branch order decides
    (["Foo", "DeepseekV3ForCausalLM"], {}, "mla"),
    (["MambaForCausalLM", "DeepseekV3ForCausalLM"], {}, "mla"),
    (["DeepseekV4ForCausalLM", "MiniCPM3ForCausalLM"], {}, "mha"),
    (["Glm4MoeForCausalLMNextN", "MiniCPM3ForCausalLM"], {}, "mha"),
    ([], {}, "mha"),
]


@pytest.mark.parametrize(("archs", "fields", "expected"), CASES,
                         ids=[f"{'+'.join(a) or 'none'}-{f}" for a, f, _ in CASES])
def test_classify(table: ArchTable, archs: list[str], fields: dict[str, Any],
                  expected: str) -> None:
    assert classify(table, archs, fields) == expected


# _config_draft_model (model_config.py:1010-1210): only architectures[0] is renamed.
DRAFTS = [
    (["DeepseekV3ForCausalLM"], ("DeepseekV3ForCausalLMNextN",), "mla"),
    (["DeepseekV32ForCausalLM"], ("DeepseekV3ForCausalLMNextN",), "mla"),
    (["Glm4MoeForCausalLM"], ("Glm4MoeForCausalLMNextN",), "mha"),
    (["Glm4MoeLiteForCausalLM"], ("Glm4MoeLiteForCausalLMNextN",), "mla"),
    (["DeepseekV4ForCausalLM"], ("DeepseekV4ForCausalLMNextN",), "mha"),
    (["MiMoV2FlashForCausalLM"], ("MiMoV2MTP",), "mha"),
    (["BailingMoeV3ForCausalLM"], ("BailingMoeForCausalLMNextN",), "mha"),  # no kv_lora_rank
    (["Qwen3_5MoeForConditionalGeneration"], ("Qwen3_5ForCausalLMMTP",), "mha"),
    (["LlamaForCausalLM"], ("LlamaForCausalLM",), "mha"),
    (["Foo", "DeepseekV3ForCausalLM"], ("Foo", "DeepseekV3ForCausalLM"), "mla"),
    ([], (), "mha"),
]


@pytest.mark.parametrize(("archs", "renamed", "arch"), DRAFTS)
def test_draft_renames(table: ArchTable, archs: list[str], renamed: tuple[str, ...],
                       arch: str) -> None:
    assert draft_architectures(table, archs) == renamed
    assert classify(table, renamed, {}) == arch


def test_bailing_v3_draft_with_kv_lora_rank_is_mla(table: ArchTable) -> None:
    renamed = draft_architectures(table, ["BailingMoeV3ForCausalLM"])
    assert classify(table, renamed, {"kv_lora_rank": 512}) == "mla"


def test_table_names_its_sglang_version(table: ArchTable) -> None:
    assert table.sglang_version == "0.5.23"
    assert table.default == "mha"


GOOD = """
[meta]
sglang_version = "0.5.23"
[[rules]]
arch = "mla"
any_of = ["A"]
"""


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("not toml [", None),
        ("[meta]\n", "meta.sglang_version"),
        (GOOD + '[[rules]]\narch = "gqa"\nany_of = ["B"]\n', "rules[1].arch"),
        (GOOD + '[[rules]]\narch = "mha"\nany_of = []\n', "rules[1].any_of"),
        (GOOD + '[[rules]]\narch = "mha"\nany_of = "B"\n', "rules[1].any_of"),
        (GOOD + '[[rules]]\narch = "mha"\nany_of = ["B"]\nwhen = { field = "x", test = "eq" }\n',
         "rules[1].when.test"),
        (GOOD + "[draft_renames]\nA = 1\n", "draft_renames"),
        (GOOD.replace('"0.5.23"', "5"), "meta.sglang_version"),
    ],
)
def test_parse_errors_name_file_and_key(text: str, key: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        parse_arch_table(text, "arch.toml")
    assert info.value.path == "arch.toml"
    assert info.value.key == key


@pytest.mark.parametrize(
    "text",
    [
        GOOD + '[meta2]\nx = 1\n',
        GOOD + '[[rules]]\narch = "mha"\nany_of = ["B"]\ntypo = 1\n',
        GOOD.replace("[meta]", "[meta]\ndefault = \"gqa\""),
        GOOD + '[[rules]]\narch = "mla"\nany_of = ["B"]\nwhen = { test = "not_null" }\n',
    ],
)
def test_parse_rejects_unknown_keys_and_bad_values(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_arch_table(text, "arch.toml")


def test_parse_good_table() -> None:
    t = parse_arch_table(GOOD, "arch.toml")
    assert classify(t, ["A"], {}) == "mla"
    assert classify(t, ["B"], {}) == "mha"


# --- another release's lists ---------------------------------------------------------------


def test_an_architecture_added_after_a_release_is_mha_there() -> None:
    new, old = arch_table("0.5.23"), arch_table("0.5.18")
    assert classify(new, ["GigaChat35ForCausalLM"], {}) == "mla"
    assert classify(old, ["GigaChat35ForCausalLM"], {}) == "mha"  # not in 0.5.18's list
    assert classify(old, ["DeepseekV3ForCausalLM"], {}) == "mla"
    # A conditional entry keeps its condition where that release has it.
    assert classify(old, ["DeepseekVL2ForCausalLM"], {"use_mla": False}) == "mha"
    assert classify(old, ["DeepseekVL2ForCausalLM"], {}) == "mla"
    assert old.sglang_version == "0.5.18"
