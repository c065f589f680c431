"""TRL's SFTTrainer and DPOTrainer under the presets, on 2 CPU processes, launched as users launch them."""

import json

import pytest

from conftest import REPO, assert_reload_bitwise, assert_same_losses, launcher_script, read_result, run_worker, worker_env
from hf_zero import load_config
from hf_zero.config.live import LEAF_THRESHOLD
from hf_zero.distributed import free_port
from hf_zero.config.accelerate_yaml import accelerate_config_text, inline_deepspeed_config

pytestmark = pytest.mark.multiproc
TRL_WORKER = REPO / "tests" / "workers" / "train_trl.py"


def _fell(losses):
    return losses[-1] < losses[0]


@pytest.mark.slow  # make test keeps TRL's DPO under zero3 (a partitioned reference model); SFT runs in make test-long
def test_sft_chat_with_assistant_only_loss_under_zero3_torchrun(tiny_models, tmp_path):
    """hf_zero.zero_arguments(SFTConfig) and callbacks=[ZeroCallback()]: what a TRL script adds."""
    out = tmp_path / "sft"
    run_worker(["--model", tiny_models["llama_tok"], "--out", out, "--trainer", "sft", "--deepspeed", "zero3"],
               nproc=2, script=TRL_WORKER)
    result = read_result(out)
    assert result["engine"] == "DeepSpeedEngine" and result["dp_world_size"] == 2 and result["partitioned_at_load"]
    assert 0 < result["trained_tokens"] < result["tokens"]  # the user turn is masked out of the loss
    assert _fell(result["losses"])
    assert_reload_bitwise(out)


def _zero3_no_persistence(tmp_path):
    """zero3 with every parameter partitioned (the tiny model's tensors are all under the persistence threshold)."""
    from hf_zero import load_config

    config = load_config("zero3", overrides={"zero_optimization.stage3_param_persistence_threshold": 0})
    yaml = inline_deepspeed_config(accelerate_config_text("zero3"), config)
    (tmp_path / "accelerate.yaml").write_text(yaml)
    return tmp_path / "accelerate.yaml"


def test_dpo_reference_model_is_partitioned_under_zero3_accelerate(tiny_models, tmp_path):
    out = tmp_path / "dpo"
    yaml = _zero3_no_persistence(tmp_path)
    run_worker(["--model", tiny_models["llama_tok"], "--out", out, "--trainer", "dpo"], nproc=2,
               launcher=f"accelerate:{yaml}", script=TRL_WORKER)
    result = read_result(out)
    assert result["engine"] == "DeepSpeedEngine" and result["dp_world_size"] == 2
    assert result["ref_model"] == "DeepSpeedEngine" and result["ref_partitioned"]
    # each rank holds half of the reference model, not a whole copy
    assert result["ref_local_numel"] == 0 and result["ref_shard_numel"] <= result["ref_full_numel"] // 2 + 64
    assert _fell(result["losses"])
    assert_reload_bitwise(out)


@pytest.mark.slow
def test_dpo_reference_model_is_a_whole_copy_per_rank_under_zero2(tiny_models, tmp_path):
    """TRL builds the reference as a stage-0 engine under ZeRO-1/2: its whole 16/32-bit weights on every GPU."""
    out = tmp_path / "dpo2"
    run_worker(["--model", tiny_models["llama_tok"], "--out", out, "--trainer", "dpo", "--deepspeed", "zero2",
                "--callback", "attach"], nproc=2, script=TRL_WORKER)
    result = read_result(out)
    assert result["ref_model"] == "DeepSpeedEngine" and not result["ref_partitioned"]
    assert result["ref_local_numel"] == result["ref_full_numel"]
    assert _fell(result["losses"])
    assert_reload_bitwise(out)


@pytest.mark.slow
def test_sft_lora_with_gradient_checkpointing_under_zero3_saves_a_full_adapter_and_merges(tiny_models, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "sft_lora"
    run_worker(["--model", tiny_models["llama_tok"], "--out", out, "--trainer", "sft", "--deepspeed", "zero3", "--lora",
                "--gc"], nproc=2, script=TRL_WORKER)
    result = read_result(out)
    assert _fell(result["losses"])
    # TRL picks reentrant checkpointing for PEFT under ZeRO-3; right for this DeepSpeed, so hf_zero stays quiet
    assert result["use_reentrant"] is True
    assert not any("use_reentrant" in w for w in result["warnings"]), result["warnings"]
    from hf_zero.lora import adapter_problems

    assert adapter_problems(out / "adapter") == []
    saved = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    expected = load_file(str(out / "expected.safetensors"))
    assert saved and len(saved) == len(expected)
    assert all(t.numel() > 0 for t in saved.values())
    assert any(t.abs().sum() > 0 for n, t in saved.items() if "lora_B" in n)  # lora_B starts at 0: it trained
    merged = AutoModelForCausalLM.from_pretrained(out / "merged", dtype=torch.float32)
    assert merged.config.architectures == ["LlamaForCausalLM"]


@pytest.mark.slow
def test_grpo_generates_with_the_partitioned_model_under_zero3(tiny_models, tmp_path):
    """GRPOTrainer without vLLM: the ZeRO-3 model generates its completions (TRL gathers it for generation)."""
    out = tmp_path / "grpo"
    run_worker(["--model", tiny_models["llama_tok"], "--out", out, "--trainer", "grpo", "--deepspeed", "zero3"],
               nproc=2, script=TRL_WORKER)
    result = read_result(out)
    assert result["engine"] == "DeepSpeedEngine" and result["dp_world_size"] == 2 and result["partitioned_at_load"]
    assert len(result["completion_lengths"]) == 4 and all(n > 0 for n in result["completion_lengths"])
    assert_reload_bitwise(out)


@pytest.mark.slow
def test_sft_with_long_context_trains_as_without_it(tiny_models, tmp_path):
    """SFTTrainer scores its loss with TRL's fused head already; ZeroCallback(long_context=True) adds the tiled MLP
    and the offloaded checkpoints (and turns checkpointing on) under ZeRO-3 without changing what is learned."""
    common = ["--model", tiny_models["llama_tok"], "--trainer", "sft", "--deepspeed", "zero3"]
    run_worker([*common, "--out", tmp_path / "plain", "--gc"], nproc=2, script=TRL_WORKER)
    out = tmp_path / "long"
    run_worker([*common, "--out", out, "--long-context"], nproc=2, script=TRL_WORKER)
    plain, long = read_result(tmp_path / "plain"), read_result(out)
    assert "offload_activations=True" in long["long_context"] and long["long_context"] != "None"
    assert_same_losses(long["losses"], plain["losses"], "SFT with long context, plain SFT")
    assert _fell(long["losses"])
    assert_reload_bitwise(out)


@pytest.mark.slow  # about 30 s on 2 cores
def test_trls_own_sft_script_on_one_process_with_the_zero3_yaml_from_another_directory(tiny_models, tmp_path):
    """TRL's sft script, unmodified, as the TRL page launches it on one GPU: ``accelerate launch --num_processes 1
    --config_file <zero3.yaml> -m trl.scripts.sft``. Under the launcher Accelerate's state is DEEPSPEED, so TRL loads
    the model without a device_map and zero.Init partitions it. No hf_zero code runs in the script, so on CPU the
    YAML is the zero3 one with the GPU-only leaf-module threshold at 0 (as `hf-zero check --fix` writes it; on CPU
    DeepSpeed's leaf path crashes in record_stream), launched from a directory without recipes/."""
    import subprocess

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    data = tmp_path / "chats"
    data.mkdir()
    rows = [{"messages": [{"role": "user", "content": "what is two plus two"}, {"role": "assistant", "content": "it is four"}]}
            for _ in range(8)]
    (data / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    out, yaml = tmp_path / "sft", tmp_path / "zero3_cpu.yaml"
    config = load_config("zero3", overrides={f"zero_optimization.{LEAF_THRESHOLD}": 0})
    yaml.write_text(inline_deepspeed_config(accelerate_config_text("zero3"), config))
    cmd = [launcher_script("accelerate"), "launch", "--num_processes", "1", "--main_process_port", str(free_port()),
           "--config_file", str(yaml), "-m", "trl.scripts.sft",
           "--model_name_or_path", str(tiny_models["llama_tok"]), "--dataset_name", str(data), "--output_dir", str(out),
           "--max_steps", "3", "--per_device_train_batch_size", "2", "--learning_rate", "1e-2", "--use_cpu",
           "--report_to", "none", "--save_strategy", "no", "--logging_steps", "1", "--bf16", "false"]
    proc = subprocess.run(cmd, cwd=data, env=worker_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "DeepSpeed Zero-3 is not compatible with passing a device_map" not in proc.stderr
    saved = load_file(str(out / "model.safetensors"))  # gathered 16-bit weights: the preset gathers on save
    start = load_file(str(tiny_models["llama_tok"] / "model.safetensors"))
    assert set(saved) == set(start) and all(t.numel() > 0 for t in saved.values())
    assert [name for name in start if not torch.equal(start[name], saved[name])], "no weight moved in training"
    AutoModelForCausalLM.from_pretrained(str(out))  # reloads
