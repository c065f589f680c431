"""The leaf-ranks check: ZeRO-3 leaf modules on several GPU ranks that still use DeepSpeed's fast leaf path, or whose
class the two-rank gate has not proven, are named."""

import torch
from deepspeed.utils import set_z3_leaf_modules
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from hf_zero.zero3.leaves import leaves_on_ranks


def tiny_llama():
    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=4, vocab_size=64))


def test_leaves_on_the_fast_path_are_a_warning_with_the_measurement():
    model = tiny_llama()
    set_z3_leaf_modules(model, [type(model.model.layers[0])])
    severity, message = leaves_on_ranks(model, ranks=2, on_gpu=True, fast_release=True)
    assert severity == "warning" and "2 ZeRO-3 leaf module(s) on 2 GPU ranks (LlamaDecoderLayer" in message
    assert "model.layers.0, model.layers.1" in message and "fast leaf path" in message
    assert "benchmarks/1xH200/two_ranks/h100/gate_1.35b" in message and "leaf-release" in message


def test_a_class_the_gate_has_not_covered_gets_an_info_line():
    model = tiny_llama()
    set_z3_leaf_modules(model, [type(model.model.layers[0].mlp)])
    severity, message = leaves_on_ranks(model, ranks=2, on_gpu=True, fast_release=False)
    assert severity == "info" and "(LlamaMLP: model.layers.0.mlp, model.layers.1.mlp)" in message
    assert "proven: LlamaDecoderLayer, Qwen3MoeSparseMoeBlock" in message


def test_quiet_on_one_rank_on_cpu_without_leaves_or_with_proven_leaves():
    model = tiny_llama()
    assert leaves_on_ranks(model, ranks=2, on_gpu=True, fast_release=True) is None  # no leaves
    set_z3_leaf_modules(model, [type(model.model.layers[0])])
    assert leaves_on_ranks(model, ranks=1, on_gpu=True, fast_release=True) is None
    assert leaves_on_ranks(model, ranks=2, on_gpu=False, fast_release=True) is None  # CPU ranks: bit for bit
    assert leaves_on_ranks(model, ranks=2, on_gpu=True, fast_release=False) is None  # proven, ordinary release


def test_quiet_for_moe_blocks_the_gate_proved():
    # the two-rank gate's Qwen3-MoE (benchmarks/1xH200/two_ranks/h100/gate_moe): its MoE blocks as leaves train as DDP
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                                   num_experts=4, num_experts_per_tok=2, vocab_size=64))
    set_z3_leaf_modules(model, [type(model.model.layers[0].mlp)])
    assert leaves_on_ranks(model, ranks=2, on_gpu=True, fast_release=False) is None
    severity, message = leaves_on_ranks(model, ranks=2, on_gpu=True, fast_release=True)  # the fast path still warns
    assert severity == "warning" and "Qwen3MoeSparseMoeBlock" in message
