"""saved_model_problems: the ZeRO-3 failure shapes it must catch, and a good folder it passes."""

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
