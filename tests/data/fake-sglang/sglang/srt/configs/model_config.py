from enum import Enum, auto


class AttentionArch(Enum):
    MLA = auto()
    MHA = auto()
    SSM = auto()


PURE_SSM_ARCHITECTURES = ("MambaForCausalLM",)
DRAFTS = ["QwenMoe", "QwenNext"]


class ModelConfig:
    def _config_draft_model(self, is_draft_model):
        if is_draft_model and self.hf_config.architectures[0] == "DeepseekV3ForCausalLM":
            self.hf_config.architectures[0] = "DeepseekV3ForCausalLMNextN"
        if is_draft_model and self.hf_config.architectures[0] in DRAFTS:
            self.hf_config.architectures = ["QwenMTP"]

    def _derive(self):
        if (
            "DeepseekV3ForCausalLM" in self.hf_config.architectures
            or (
                "PixtralForConditionalGeneration" in self.hf_config.architectures
                and getattr(self.hf_text_config, "kv_lora_rank", None) is not None
            )
        ):
            self.attention_arch = AttentionArch.MLA
        elif "DeepseekV4ForCausalLM" in self.hf_config.architectures:
            self.attention_arch = AttentionArch.MHA
        else:
            self.attention_arch = AttentionArch.MHA
