"""Tiny mixture-of-experts models from config classes (no hub): transformers' fused-expert architectures, and a
transformers-4.x-style one whose experts are a ModuleList (how remote-code MoE models look)."""

import torch
import torch.nn.functional as F
from transformers import (AutoConfig, AutoModelForCausalLM, DeepseekV3Config, GptOssConfig, MixtralConfig, OlmoeConfig, PretrainedConfig, PreTrainedModel,
                          Qwen2MoeConfig, Qwen3MoeConfig)
from transformers.modeling_outputs import CausalLMOutput

VOCAB = 64
_COMMON = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
               num_key_value_heads=1, max_position_embeddings=64)


def fused_config(arch: str):
    """A tiny config of ``arch``: 4 routed experts, 2 per token."""
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(**_COMMON, moe_intermediate_size=8, num_experts=4, num_experts_per_tok=2, head_dim=8)
    if arch == "mixtral":
        return MixtralConfig(**_COMMON, num_local_experts=4, num_experts_per_tok=2)
    if arch == "qwen2_moe":
        return Qwen2MoeConfig(**_COMMON, moe_intermediate_size=8, shared_expert_intermediate_size=8, num_experts=4,
                              num_experts_per_tok=2)
    if arch == "gpt_oss":
        return GptOssConfig(**_COMMON, num_local_experts=4, num_experts_per_tok=2, head_dim=8,
                            layer_types=["full_attention"] * 2)
    if arch == "deepseek_v3":
        return DeepseekV3Config(**_COMMON, moe_intermediate_size=8, n_routed_experts=4, num_experts_per_tok=2,
                                n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, q_lora_rank=8,
                                kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8)
    if arch == "olmoe":
        return OlmoeConfig(**_COMMON, num_experts=4, num_experts_per_tok=2, eos_token_id=None, pad_token_id=None)
    raise ValueError(arch)


FUSED = ("qwen3_moe", "mixtral", "qwen2_moe", "gpt_oss", "deepseek_v3", "olmoe")


class ListMoeConfig(PretrainedConfig):
    model_type = "hf_zero_test_list_moe"

    def __init__(self, vocab_size=VOCAB, hidden_size=16, num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                 **kwargs):
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers
        self.num_experts, self.num_experts_per_tok = num_experts, num_experts_per_tok
        self.initializer_range = 0.02
        super().__init__(**kwargs)


class Expert(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.up = torch.nn.Linear(hidden, 2 * hidden, bias=False)
        self.act = torch.nn.SiLU()
        self.down = torch.nn.Linear(2 * hidden, hidden, bias=False)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class ListMoeBlock(torch.nn.Module):
    """Runs only the experts some token was routed to, one module call each: what remote-code MoE blocks do."""

    def __init__(self, config):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.gate = torch.nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = torch.nn.ModuleList(Expert(config.hidden_size) for _ in range(config.num_experts))

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.topk(F.softmax(self.gate(flat), dim=-1), self.top_k, dim=-1)
        out = torch.zeros_like(flat)
        for index, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == index)
            if token.numel():
                out = out.index_add(0, token, expert(flat[token]) * weights[token, slot, None])
        return x + out.view_as(x)


class ListMoeForCausalLM(PreTrainedModel):
    config_class = ListMoeConfig
    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = torch.nn.ModuleList(ListMoeBlock(config) for _ in range(config.num_hidden_layers))
        self.head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids, labels=None):
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = layer(hidden)
        logits = self.head(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        return CausalLMOutput(loss=loss, logits=logits)


# as a remote-code model is: from_config / from_pretrained build it (under zero.Init while a stage-3 config lives)
AutoConfig.register(ListMoeConfig.model_type, ListMoeConfig)
AutoModelForCausalLM.register(ListMoeConfig, ListMoeForCausalLM)


def build(case: str):
    """The model of ``case``: "ARCH:IMPL" (a fused architecture and its experts_implementation) or "modulelist"."""
    if case == "modulelist":
        return AutoModelForCausalLM.from_config(ListMoeConfig())
    arch, impl = case.split(":")
    return AutoModelForCausalLM.from_config(fused_config(arch), experts_implementation=impl)
