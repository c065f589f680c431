"""Which mixture-of-experts blocks hf_zero makes ZeRO-3 leaves, found from the model's structure (the two-rank
training runs are in tests/multiproc/test_moe_training.py)."""

import logging
import sys
from pathlib import Path

import pytest
import torch
from deepspeed.utils import set_z3_leaf_modules, unset_z3_leaf_modules, z3_leaf_module
from transformers import AutoModelForCausalLM, LlamaConfig

import hf_zero
from hf_zero.zero3.moe import make_moe_leaves, moe_blocks, moe_leaves_problem

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers"))
from moe_models import FUSED, build  # noqa: E402

ZERO3 = {"zero_optimization": {"stage": 3}}
# the block classes of each fused architecture, and whether its eager experts call a child module per expert hit
BLOCKS = {"qwen3_moe": "Qwen3MoeSparseMoeBlock", "mixtral": "MixtralSparseMoeBlock", "qwen2_moe": "Qwen2MoeSparseMoeBlock",
          "gpt_oss": "GptOssMLP", "deepseek_v3": "DeepseekV3MoE", "olmoe": "OlmoeSparseMoeBlock"}


def leaves(model) -> list:
    return [name for name, m in model.named_modules() if z3_leaf_module(m)]


@pytest.mark.requires("torch>=2.9.0")  # transformers' grouped_mm experts path needs it (the floor's torch 2.6 has not)
@pytest.mark.parametrize("arch", FUSED)
def test_fused_blocks_are_found_and_only_their_eager_path_becomes_a_leaf(arch):
    with torch.device("meta"):
        fused = build(f"{arch}:grouped_mm")
        eager = build(f"{arch}:eager")
    blocks = moe_blocks(fused)
    assert blocks and {type(b.block).__name__ for b in blocks} == {BLOCKS[arch]}
    assert all(b.fused and b.count == 4 for b in blocks)
    assert make_moe_leaves(fused, ZERO3) == []  # one grouped_mm call per forward: every rank runs the same modules
    made = make_moe_leaves(eager, ZERO3)
    if arch == "gpt_oss":  # its experts have no child module: the eager loop runs inside one module call
        assert made == []
    else:
        assert made == [b.name for b in moe_blocks(eager)] and leaves(eager) == made


def test_a_modulelist_moe_becomes_a_leaf_per_block_and_the_decoder_stack_does_not():
    model = build("modulelist")
    assert make_moe_leaves(model, ZERO3) == ["layers.0", "layers.1"]
    assert [type(b.experts).__name__ for b in moe_blocks(model)] == ["ModuleList", "ModuleList"]


def test_a_dense_model_has_no_moe_block():
    model = AutoModelForCausalLM.from_config(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                                                         num_attention_heads=2, vocab_size=4))
    assert moe_blocks(model) == [] and make_moe_leaves(model, ZERO3) == []


def test_off_another_stage_or_a_config_leaf_module_change_nothing(caplog):
    model = build("deepseek_v3:eager")
    assert make_moe_leaves(model, ZERO3, "off") == []
    assert make_moe_leaves(model, {"zero_optimization": {"stage": 2}}) == []
    with caplog.at_level(logging.INFO, logger="hf_zero"):
        assert make_moe_leaves(model, {"zero_optimization": {"stage": 3, "leaf_module": {"classes": []}}}) == []
    assert "left to the config's zero_optimization.leaf_module: DeepseekV3MoE" in caplog.text
    assert leaves(model) == []


def test_leaf_flags_the_user_set_are_kept(caplog):
    model = build("olmoe:eager")
    unset_z3_leaf_modules(model, ["OlmoeSparseMoeBlock"])  # the user's "not a leaf"
    assert make_moe_leaves(model, ZERO3) == [] and leaves(model) == []
    model = build("olmoe:eager")
    set_z3_leaf_modules(model, ["OlmoeExperts"])  # a leaf inside the block: the block is left as the user made it
    assert make_moe_leaves(model, ZERO3) == [] and leaves(model) == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    model = build("olmoe:eager")
    with caplog.at_level(logging.INFO, logger="hf_zero"):
        assert make_moe_leaves(model, ZERO3) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    [line] = [r.getMessage() for r in caplog.records if "mixture-of-experts" in r.getMessage()]
    assert "made 2 mixture-of-experts block(s) ZeRO-3 leaves" in line and line.endswith(": OlmoeSparseMoeBlock")


def test_blocks_with_frozen_weights_made_leaves_are_warned_about_where_leaf_inputs_does_not_apply(caplog):
    model = build("modulelist")
    with caplog.at_level(logging.INFO, logger="hf_zero"):
        make_moe_leaves(model, ZERO3, version="0.20.0")
    assert "frozen" not in caplog.text  # every weight trains: quiet

    def frozen_experts():
        model = build("modulelist")
        for param in model.layers[1].experts.parameters():
            param.requires_grad_(False)
        return model

    with caplog.at_level(logging.WARNING, logger="hf_zero"):
        make_moe_leaves(frozen_experts(), ZERO3)  # the installed release: leaf-inputs covers it, quiet
    assert "frozen" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="hf_zero"):
        make_moe_leaves(frozen_experts(), ZERO3, version="0.20.0")
    assert "1 mixture-of-experts block(s) made ZeRO-3 leaves hold frozen parameters (e.g. layers.1" in caplog.text
    assert "Fix: if it fails so, train with ZeRO-2" in caplog.text


def test_option_values():
    assert moe_leaves_problem("auto") is None and moe_leaves_problem("off") is None
    with pytest.raises(hf_zero.ConfigError, match="moe_leaves must be one of 'auto', 'off', got False. Fix:"):
        hf_zero.ZeroCallback(moe_leaves=False)
    assert hf_zero.ZeroCallback(moe_leaves="off").options["moe_leaves"] == "off"

