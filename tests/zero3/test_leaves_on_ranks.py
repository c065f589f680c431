"""The leaf-ranks check: ZeRO-3 leaf modules on several GPU ranks that the two-rank gate has not proven are named."""

import torch
from deepspeed.utils import set_z3_leaf_modules
from transformers import LlamaConfig, LlamaForCausalLM

from hf_zero.zero3.leaves import leaves_on_ranks


def tiny_llama():
    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=4, vocab_size=64))


def test_leaves_on_two_gpu_ranks_are_named_with_the_measurement():
    model = tiny_llama()
    set_z3_leaf_modules(model, [type(model.model.layers[0])])
    severity, message = leaves_on_ranks(model, ranks=2, on_gpu=True)
    assert severity == "warning" and "2 ZeRO-3 leaf module(s) on 2 GPU ranks (LlamaDecoderLayer" in message
    assert "model.layers.0, model.layers.1" in message and "benchmarks/2xH200" in message
    # once the gate proves a class, one it has not covered gets an INFO line
    severity, message = leaves_on_ranks(model, ranks=2, on_gpu=True, proven=frozenset({"LlamaMLP"}))
    assert severity == "info" and "LlamaDecoderLayer" in message


def test_quiet_on_one_rank_on_cpu_without_leaves_or_with_proven_leaves():
    model = tiny_llama()
    assert leaves_on_ranks(model, ranks=2, on_gpu=True) is None  # no leaves
    set_z3_leaf_modules(model, [type(model.model.layers[0])])
    assert leaves_on_ranks(model, ranks=1, on_gpu=True) is None
    assert leaves_on_ranks(model, ranks=2, on_gpu=False) is None  # CPU ranks: leaves are bit for bit
    assert leaves_on_ranks(model, ranks=2, on_gpu=True, proven=frozenset({"LlamaDecoderLayer"})) is None
