"""leaf-inputs: a trainable ZeRO-3 leaf whose inputs need no gradient is given one, so that torch runs DeepSpeed's
gradient reduction (a full backward hook on the leaf) after the leaf's backward, not before it. In process, with
DeepSpeed's own leaf flag and a full backward hook standing for its reduction; the two-rank run is in
tests/checks/test_doors.py."""

import pytest
import torch
from deepspeed.utils import set_z3_leaf_modules

from hf_zero.zero3.leaves import leaf_inputs_require_grad


class Block(torch.nn.Module):
    def __init__(self, trainable=True):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.linear.requires_grad_(trainable)

    def forward(self, x):
        return self.linear(x)


def _order_of_backward(model, fix: bool):
    """What ran first in the backward: the block's weight gradient or its full backward hook."""
    if fix:
        assert leaf_inputs_require_grad(model) is not None
    seen = []
    block = model[1]
    block.register_full_backward_hook(lambda *args: seen.append("hook"))
    block.linear.weight.register_hook(lambda grad: seen.append("weight gradient"))
    model(torch.ones(2, 4)).sum().backward()
    return seen


def test_a_leaf_without_an_input_gradient_gets_one():
    # a frozen layer, then a trainable leaf: the leaf's input needs no gradient
    def build():
        model = torch.nn.Sequential(Block(trainable=False), Block())
        set_z3_leaf_modules(model, [Block])
        return model

    assert _order_of_backward(build(), fix=False) == ["hook", "weight gradient"]  # DeepSpeed's reduction too early
    fixed = build()
    assert _order_of_backward(fixed, fix=True) == ["weight gradient", "hook"]
    # the values are the model's own: the same output and the same weight gradient as without the hook
    plain = build()
    plain.load_state_dict(fixed.state_dict())
    for model in (plain, fixed):
        model.zero_grad()
        model(torch.arange(8.0).view(2, 4)).square().sum().backward()
    assert torch.equal(plain[1].linear.weight.grad, fixed[1].linear.weight.grad)
    # once per module, however often the fix is applied (both doors run the check list once, a resume again)
    before = len(fixed[1]._forward_pre_hooks)
    leaf_inputs_require_grad(fixed)
    assert len(fixed[1]._forward_pre_hooks) == before
    with torch.no_grad():  # no backward to order: the input is left as it is
        assert fixed(torch.ones(1, 4)).requires_grad is False


def test_quiet_without_trainable_leaves_or_outside_the_read_releases(caplog):
    plain = torch.nn.Sequential(Block(trainable=False), Block())
    assert leaf_inputs_require_grad(plain) is None  # no leaves
    frozen = torch.nn.Sequential(Block(trainable=False), Block(trainable=False))
    set_z3_leaf_modules(frozen, [Block])
    assert leaf_inputs_require_grad(frozen) is None  # leaves, none trainable: nothing to reduce
    model = torch.nn.Sequential(Block(trainable=False), Block())
    set_z3_leaf_modules(model, [Block])
    assert leaf_inputs_require_grad(model, version="0.20.0") is None
    assert not model[1]._forward_pre_hooks
    assert "not applied on DeepSpeed 0.20.0" in caplog.text


@pytest.mark.parametrize("version, leaves_kept", [("0.19.8", True), ("0.18.0", True), ("0.20.0", False)])
def test_frozen_weights_keep_threshold_leaves_where_the_fix_covers_the_release(version, leaves_kept):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_zero.config.presets import load_config
    from hf_zero.lora import no_leaf_modules_with_frozen_weights

    lora = get_peft_model(LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                       num_attention_heads=2, num_key_value_heads=2, vocab_size=64)),
                          LoraConfig(r=2, target_modules=["q_proj"]))
    config = load_config("zero3")
    config["zero_optimization"]["stage3_module_granularity_threshold"] = 5_000_000
    note = no_leaf_modules_with_frozen_weights(lora, config, version=version)
    assert (note is None) == leaves_kept
    assert (config["zero_optimization"]["stage3_module_granularity_threshold"] == 5_000_000) == leaves_kept
