"""Reentrant and non-reentrant gradient checkpointing under ZeRO-3 on the installed DeepSpeed, 2 CPU processes.

Both recompute each layer's forward in backward; ZeRO-3 gathers the layer's partitions again for it. On DeepSpeed
0.19.8 the two train to the same bits, for full fine-tuning and for LoRA, so ZeroCallback leaves a user's
``use_reentrant=True`` alone (TRL picks it for PEFT under ZeRO-3) and says nothing about it.
stage3_param_persistence_threshold is 0 so every tensor of the tiny model is a real partition, gathered and
released around each recompute, as a large model's are (the preset's 1e6 keeps them all whole).
"""

import json

import pytest

from conftest import assert_reload_bitwise, assert_same_losses, assert_same_weights, read_result, run_lora, run_worker

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def _zero3_every_tensor_partitioned(tmp_path):
    from hf_zero import load_config

    config = load_config("zero3", overrides={"zero_optimization.stage3_param_persistence_threshold": 0})
    path = tmp_path / "zero3_p0.json"
    path.write_text(json.dumps(config))
    return path


def test_full_fine_tuning_learns_the_same_with_reentrant_checkpointing(tiny_models, tmp_path):
    config = _zero3_every_tensor_partitioned(tmp_path)
    results = {}
    for reentrant in ("true", "false"):
        out = tmp_path / f"reentrant_{reentrant}"
        run_worker(["--model", tiny_models["llama"], "--out", out, "--deepspeed", config, "--gc", "--reentrant", reentrant,
                    "--steps", "6"], nproc=2)
        results[reentrant] = read_result(out)
    reentrant, non_reentrant = results["true"], results["false"]
    assert reentrant["engine"] == "DeepSpeedEngine" and reentrant["partitioned_at_load"]
    assert reentrant["use_reentrant"] is True and non_reentrant["use_reentrant"] is False  # the user's choice, kept
    assert reentrant["warnings"] == [] == non_reentrant["warnings"]
    assert len(reentrant["losses"]) == 6 and reentrant["losses"][-1] < reentrant["losses"][0]
    assert_same_losses(reentrant["losses"], non_reentrant["losses"], "reentrant, non-reentrant")
    assert_same_weights(tmp_path / "reentrant_true" / "expected.safetensors", tmp_path / "reentrant_false" / "expected.safetensors")
    assert_reload_bitwise(tmp_path / "reentrant_true")


def test_lora_learns_the_same_with_reentrant_checkpointing(tiny_models, tmp_path):
    # run_lora: persistence threshold 0, so the LoRA tensors and the frozen base are partitions
    results = {reentrant: run_lora(tiny_models["llama"], tmp_path / f"lora_{reentrant}", "--gc", "--reentrant", reentrant)
               for reentrant in ("true", "false")}
    reentrant, non_reentrant = results["true"], results["false"]
    assert reentrant["use_reentrant"] is True and non_reentrant["use_reentrant"] is False
    assert reentrant["warnings"] == [] == non_reentrant["warnings"]
    assert reentrant["losses"][-1] < reentrant["losses"][0]
    assert_same_losses(reentrant["losses"], non_reentrant["losses"], "LoRA reentrant, non-reentrant")
    assert_same_weights(tmp_path / "lora_true" / "expected_adapter.safetensors", tmp_path / "lora_false" / "expected_adapter.safetensors")
