"""hf-zero plan on mixture-of-experts configs: total and active (per-token) parameters, from transformers' config
classes with the published models' sizes (their model cards give total / active)."""

import json

import pytest
from transformers import DeepseekV3Config, LlamaConfig, MixtralConfig, Qwen3MoeConfig

from hf_zero.cli import main

# Qwen3-30B-A3B's config.json values (Qwen3MoeConfig's defaults are another, smaller model)
QWEN3_30B_A3B = dict(hidden_size=2048, num_hidden_layers=48, num_experts=128, num_experts_per_tok=8,
                     moe_intermediate_size=768, intermediate_size=6144, num_attention_heads=32, num_key_value_heads=4,
                     head_dim=128, vocab_size=151936, tie_word_embeddings=False)


@pytest.mark.parametrize("config, total, active", [
    (MixtralConfig(), 46.7e9, 12.9e9),  # the defaults are Mixtral-8x7B: 46.7B total, 12.9B active
    (Qwen3MoeConfig(**QWEN3_30B_A3B), 30.5e9, 3.3e9),  # Qwen3-30B-A3B
    (DeepseekV3Config(), 671e9, 37e9),  # the defaults are DeepSeek-V3: 671B total, 37B active (without its MTP module)
])
def test_plan_reports_total_and_active_parameters(config, total, active, tmp_path, capsys):
    config.to_json_file(tmp_path / "config.json")
    main(["plan", str(tmp_path), "--gpus", "8", "--nodes", "4", "--gpu-mem", "80", "--json"])
    model = json.loads(capsys.readouterr().out)["model"]
    assert model["params"] == pytest.approx(total, rel=0.02)
    assert model["active_params"] == pytest.approx(active, rel=0.03)
    main(["plan", str(tmp_path), "--gpus", "8", "--nodes", "4", "--gpu-mem", "80"])
    first = capsys.readouterr().out.splitlines()[0]
    assert f"{model['params'] / 1e9:.2f}B parameters ({model['active_params'] / 1e9:.2f}B active per token)" in first


def test_a_dense_model_has_no_active_count(tmp_path, capsys):
    LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                vocab_size=1000).to_json_file(tmp_path / "config.json")
    main(["plan", str(tmp_path), "--gpus", "1", "--gpu-mem", "80", "--json"])
    assert json.loads(capsys.readouterr().out)["model"]["active_params"] is None
    main(["plan", str(tmp_path), "--gpus", "1", "--gpu-mem", "80"])
    assert "active per token" not in capsys.readouterr().out
