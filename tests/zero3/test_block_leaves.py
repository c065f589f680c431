"""block-leaves: where hf_zero drives a ZeRO-3 run, the model's repeated blocks become ZeRO-3 leaves (one all-gather
per decoder layer), unless the config or the user chose leaves, the blocks are in a vision tower, or the DeepSpeed
release is one hf_zero's leaf fixes were not read against."""

import pytest
import torch
from deepspeed.utils import set_z3_leaf_modules, unset_z3_leaf_modules
from transformers import LlamaConfig, LlamaForCausalLM

import hf_zero
from hf_zero.compat.deepspeed_api import is_leaf
from hf_zero.errors import ConfigError
from hf_zero.zero3.block_leaves import leaves_problem, make_block_leaves

ZERO3 = {"zero_optimization": {"stage": 3}}


def llama():
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, vocab_size=64))


def leaf_names(model) -> list:
    return [name for name, module in model.named_modules() if is_leaf(module)]


def test_the_decoder_layers_become_leaves_and_the_note_names_them():
    model = llama()
    note = make_block_leaves(model, ZERO3)
    assert leaf_names(model) == ["model.layers.0", "model.layers.1"]
    assert note.startswith("made 2 modules ZeRO-3 leaves (LlamaDecoderLayer: the model's repeated blocks)")
    assert "leaves='off'" in note


def test_a_lora_model_gets_the_same_leaves():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(llama(), LoraConfig(r=2, target_modules=["q_proj"]))
    assert make_block_leaves(model, ZERO3) is not None
    assert leaf_names(model) == ["base_model.model.model.layers.0", "base_model.model.model.layers.1"]


def test_named_classes_become_leaves_and_an_unknown_one_is_refused_naming_the_blocks():
    model = llama()
    assert "the classes leaves= names" in make_block_leaves(model, ZERO3, mode=["LlamaMLP"])
    assert leaf_names(model) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    with pytest.raises(ConfigError, match=r"leaves names \['GPT2Block'\], which this model \(LlamaForCausalLM\) does "
                                          r"not have. Fix: use its repeated blocks \(LlamaDecoderLayer\)"):
        make_block_leaves(llama(), ZERO3, mode=["GPT2Block"])


@pytest.mark.parametrize("case", ["off", "stage 2", "threshold", "leaf_module", "user set", "user unset", "release",
                                  "long context"])
def test_left_alone(case):
    model, config, mode, version = llama(), {"zero_optimization": {"stage": 3}}, "auto", None
    if case == "off":
        mode = "off"
    elif case == "stage 2":
        config["zero_optimization"]["stage"] = 2
    elif case == "threshold":
        config["zero_optimization"]["stage3_module_granularity_threshold"] = 5_000_000
    elif case == "leaf_module":
        config["zero_optimization"]["leaf_module"] = {"classes": ["LlamaMLP"]}
    elif case == "user set":
        set_z3_leaf_modules(model, [type(model.model.layers[0].mlp)])
    elif case == "user unset":
        unset_z3_leaf_modules(model, [type(model.model.layers[0])])
    elif case == "release":
        version = "0.20.0"
    elif case == "long context":
        hf_zero.enable_long_context(model, {"tiled_mlp": True, "fused_loss": False, "offload_activations": False})
    before = leaf_names(model)
    assert make_block_leaves(model, config, mode=mode, version=version) is None
    assert leaf_names(model) == before


def test_a_vision_towers_blocks_stay_per_module():
    from tiny_vlm import build

    model = build("qwen2_vl")
    make_block_leaves(model, ZERO3)
    leaves = leaf_names(model)
    assert leaves and all(".visual." not in name and not name.startswith("model.visual") for name in leaves), leaves
    assert any("language_model.layers" in name for name in leaves), leaves


def test_option_values():
    assert leaves_problem("auto") is None and leaves_problem("off") is None and leaves_problem(["A", "B"]) is None
    for bad in (True, "on", [], [""], [3]):
        assert "leaves must be 'auto', 'off' or a list of module class names" in leaves_problem(bad)
    with pytest.raises(hf_zero.ConfigError, match="leaves must be"):
        hf_zero.ZeroCallback(leaves="on")
    assert hf_zero.ZeroCallback(leaves=["LlamaDecoderLayer"]).options["leaves"] == ["LlamaDecoderLayer"]
