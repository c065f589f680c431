"""saved_model_problems: the ZeRO-3 failure shapes it must catch, and a good folder it passes."""

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from hf_zero import saved_model_problems


def test_good_folder_passes(tiny_models):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"])
    assert saved_model_problems(tiny_models["llama"], model) == []


def test_zero_size_tensors_are_caught(tiny_models, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"])
    model.config.save_pretrained(tmp_path)
    # what saving a partitioned ZeRO-3 model without gathering gives: every tensor empty
    save_file({n: torch.empty(0) for n, _ in model.named_parameters()}, str(tmp_path / "model.safetensors"))
    problems = saved_model_problems(tmp_path, model)
    assert any("zero-size tensors" in p for p in problems)


def test_shards_only_folder_is_caught(tiny_models, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"])
    model.config.save_pretrained(tmp_path)
    (tmp_path / "global_step4").mkdir()
    [problem] = saved_model_problems(tmp_path, model)
    assert "only ZeRO shards" in problem


def test_shape_mismatch_is_caught(tiny_models, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"])
    model.config.save_pretrained(tmp_path)
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    state["model.embed_tokens.weight"] = torch.zeros(3, 3)
    save_file(state, str(tmp_path / "model.safetensors"))
    [problem] = saved_model_problems(tmp_path, model)
    assert "model.embed_tokens.weight has shape (3, 3)" in problem


def _saved_moe(folder):
    """A tiny Qwen3-MoE saved as transformers saves it: one tensor per expert, 45 tensors for 25 parameters."""
    from transformers import Qwen3MoeConfig

    model = AutoModelForCausalLM.from_config(Qwen3MoeConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_experts=4, num_experts_per_tok=2))
    model.save_pretrained(folder)
    return model


def test_every_expert_tensor_of_a_fused_moe_is_compared(tmp_path):
    from safetensors import safe_open

    from hf_zero.checkpoints.saved_models import expected_saved_shapes

    model = _saved_moe(tmp_path)
    with safe_open(tmp_path / "model.safetensors", framework="pt") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert len(saved) > len(dict(model.named_parameters()))  # per-expert tensors, not the fused parameters
    assert expected_saved_shapes(model) == saved  # every saved tensor has its expected name and shape
    assert saved_model_problems(tmp_path, model) == []


@pytest.mark.parametrize("change, message", [
    ("shape", "model.layers.1.mlp.experts.3.down_proj.weight has shape (16, 7), the model has (16, 8)"),
    ("missing", "1 of the model's 45 tensors are missing (e.g. model.layers.1.mlp.experts.3.down_proj.weight)"),
])
def test_an_expert_tensor_saved_wrong_is_caught(tmp_path, change, message):
    from safetensors.torch import load_file

    model = _saved_moe(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    if change == "shape":
        state[name] = state[name][:, :7].contiguous()
    else:
        del state[name]
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    [problem] = saved_model_problems(tmp_path, model)
    assert message in problem
