"""hf-zero plan: the memory model against measured peaks, the recommendation, and the CLI."""

import contextlib
import json
import time
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from hf_zero.cli import main
from hf_zero.config import validate_config
from hf_zero.planner import (GIB, PROCESS_HOST_BYTES, ModelShape, RunShape, estimate, frozen_base_saving,
                             make_plan)

LLAMA_1B = LlamaConfig(hidden_size=2048, num_hidden_layers=24, intermediate_size=5504, vocab_size=32000,
                       num_attention_heads=16)
LLAMA_8B = LlamaConfig(hidden_size=4096, num_hidden_layers=32, intermediate_size=14336, vocab_size=32000,
                       num_attention_heads=32, num_key_value_heads=8)

# Peak allocated GiB per GPU measured on H200s: HF Trainer, bf16, seq 1024, the presets as shipped.
# 2 GPUs: benchmarks/2xH200; 1 GPU: 1xH200, where the Trainer runs without DDP and ZeRO shards
# nothing; N = 4 and 8 (and the 7.2B model): 1xH200/simulated_ranks, one GPU as rank 0 of N over torch's
# fake process group (it reproduced the 2-GPU zero2, zero3 and zero3+gc peaks exactly).
# The last field: TrainingArguments(torch_compile=True) with Accelerate's regional compilation (drc, z2rc, z3rc).
# zero2_offload's rows here were measured before the preset accumulated gradients in fp32 (planned with
# fp32_accumulation=False); MEASURED_FP32_ACCUMULATION holds the preset as it ships now.
MEASURED = [
    ("ddp", LLAMA_1B, 2, 4, False, False, 34.72),
    ("ddp", LLAMA_1B, 2, 8, True, False, 26.85),
    ("zero1", LLAMA_1B, 2, 4, False, False, 20.72),
    ("zero2", LLAMA_1B, 2, 4, False, False, 20.20),
    ("zero3", LLAMA_1B, 2, 4, False, False, 23.22),
    ("zero3_offload", LLAMA_1B, 2, 4, False, False, 13.06),
    ("zero2_offload", LLAMA_1B, 2, 4, False, False, 13.36),
    ("zero2", LLAMA_1B, 2, 8, True, False, 15.11),
    ("zero3", LLAMA_1B, 2, 8, True, False, 16.87),
    ("ddp", LLAMA_1B, 1, 4, False, False, 29.73),
    ("zero2", LLAMA_1B, 1, 4, False, False, 27.69),
    ("zero3", LLAMA_1B, 1, 4, False, False, 31.16),
    ("zero2_offload", LLAMA_1B, 1, 4, False, False, 13.34),
    ("zero2_offload", LLAMA_1B, 1, 8, True, False, 6.50),
    ("zero3_offload", LLAMA_1B, 1, 8, True, False, 6.69),
    ("zero3_offload", LLAMA_1B, 1, 4, False, False, 13.06),
    ("ddp", LLAMA_1B, 2, 4, False, True, 32.82),
    ("zero2", LLAMA_1B, 2, 4, False, True, 17.64),
    ("zero3", LLAMA_1B, 2, 4, False, True, 20.69),
    ("zero2", LLAMA_1B, 4, 4, False, False, 16.47),
    ("zero2", LLAMA_1B, 8, 4, False, False, 14.59),
    ("zero3", LLAMA_1B, 4, 4, False, False, 18.21),
    ("zero3", LLAMA_1B, 8, 4, False, False, 15.71),
    ("zero3", LLAMA_1B, 4, 8, True, False, 11.86),
    ("zero3", LLAMA_1B, 8, 8, True, False, 9.35),
    ("zero3", LLAMA_8B, 2, 2, True, False, 60.64),
    ("zero3", LLAMA_8B, 4, 2, True, False, 33.65),
    ("zero3", LLAMA_8B, 8, 2, True, False, 19.54),
    ("zero2_offload", LLAMA_1B, 2, 8, True, False, 6.50),
    ("zero2_offload", LLAMA_1B, 4, 8, True, False, 6.50),
    ("zero2_offload", LLAMA_1B, 8, 8, True, False, 6.50),
    ("zero3_offload", LLAMA_1B, 2, 8, True, False, 6.68),
    ("zero3_offload", LLAMA_1B, 4, 8, True, False, 6.68),
    ("zero3_offload", LLAMA_1B, 8, 8, True, False, 6.68),
]

# LoRA on the frozen 1.35B model (peft, lora_alpha 2r; q_proj,v_proj is peft's default for Llama): 1 and 2 GPUs
# from the sweeps (1xH200/sweeps/offload_gc_lora_padding.json, 2xH200/sweeps/memory_snapshot.json), N = 2-8 from
# 1xH200/simulated_ranks/1.35b_offload_gc_lora_fp32 and 1.35b_lora_variants_fp32, all measured before ZeroCallback cast the
# adapters to 16 bits (ZeRO-3 trained them in fp32). No constant was fitted to them.
QV = ("q_proj", "v_proj")
MEASURED_LORA = [  # setup, GPUs, micro batch, checkpointing, r, targets, fp32 adapters, GiB
    ("zero2", 1, 4, False, 16, QV, False, 10.59),
    ("zero3", 1, 4, False, 16, QV, True, 14.43),
    ("zero2", 2, 4, False, 16, QV, False, 10.57),
    ("zero3", 2, 4, False, 16, QV, True, 15.04),
    ("zero2", 4, 4, False, 16, QV, False, 10.56),
    ("zero3", 4, 4, False, 16, QV, True, 14.41),
    ("zero2", 8, 4, False, 16, QV, False, 10.56),
    ("zero3", 8, 4, False, 16, QV, True, 14.08),
    ("zero2", 2, 4, False, 16, ("all-linear",), False, 12.08),
    ("zero3", 2, 4, False, 16, ("all-linear",), True, 20.16),
    ("zero2", 2, 8, True, 16, QV, False, 6.37),
    ("zero3", 2, 8, True, 16, QV, True, 7.94),
    ("zero2", 2, 8, False, 64, QV, False, 18.48),
    # ZeroCallback casting the adapters to bf16 (1.35b_lora, 1.35b_lora_variants); predicted before they were measured
    ("zero3", 2, 4, False, 16, QV, False, 13.54),
    ("zero3", 4, 4, False, 16, QV, False, 12.91),
    ("zero3", 8, 4, False, 16, QV, False, 12.58),
    ("zero3", 2, 4, False, 16, ("all-linear",), False, 13.66),
    ("zero3", 2, 8, True, 16, QV, False, 7.93),
    ("zero2", 2, 4, False, 16, QV, False, 10.57),
    # real runs on one H200, both adapter dtypes (1xH200/sweeps/lora_adapter_dtype.json)
    ("zero3", 1, 4, False, 16, QV, False, 12.93),
    ("zero3", 1, 4, False, 16, ("all-linear",), False, 13.13),
    ("zero3", 1, 4, False, 16, ("all-linear",), True, 19.61),
]


@pytest.mark.parametrize("setup, config, gpus, micro_batch, checkpointing, compiled, measured", MEASURED)
def test_within_15_percent_of_measured_gpu_peaks(setup, config, gpus, micro_batch, checkpointing, compiled, measured):
    model = ModelShape.from_config(config)
    run = RunShape(gpus_per_node=gpus, micro_batch=micro_batch, gradient_checkpointing=checkpointing, compiled=compiled,
                   fp32_accumulation=False)
    predicted = estimate(setup, model, run).gpu_total / GIB
    assert predicted == pytest.approx(measured, rel=0.15)


# zero2_offload with data_types.grad_accum_dtype fp32, one H200 (1xH200/offload/sweeps/call12.json, call14.json):
# micro batch, accumulation, GiB. The fp32 partition (5.01 GiB) is alive through the second micro-batch's backward.
MEASURED_FP32_ACCUMULATION = [(4, 1, 16.35), (32, 2, 88.23), (32, 8, 88.23)]


@pytest.mark.parametrize("micro_batch, accumulation, measured", MEASURED_FP32_ACCUMULATION)
def test_zero2_offload_fp32_accumulation_within_15_percent_of_measured(micro_batch, accumulation, measured):
    run = RunShape(gpus_per_node=1, micro_batch=micro_batch, accumulation=accumulation)
    assert estimate("zero2_offload", ModelShape.from_config(LLAMA_1B), run).gpu_total / GIB == pytest.approx(measured, rel=0.15)


def test_fp32_accumulation_keeps_its_partition_on_the_gpu_and_none_on_the_host():
    model = ModelShape.from_config(LLAMA_1B)
    fp32, half = (estimate("zero2_offload", model, RunShape(gpus_per_node=1, micro_batch=32, accumulation=16,
                                                           fp32_accumulation=f)) for f in (True, False))
    assert fp32.gpu_total - half.gpu_total == 4 * model.params
    assert half.host_per_node > fp32.host_per_node  # the 16-bit accumulation buffers on the host


# zero3_offload with offload_optimizer.ratio and sub_group_size 1e8 (1e9 at ratio 1), one H200
# (1xH200/offload/sweeps/call15-17.json with parameters on the host, call19-22.json without, where ZeroCallback copies
# the updates through pinned buffers): ratio, 16-bit parameters on the host (offload_param), micro batch, GPU GiB,
# host RSS GiB. The GPU's sub-groups hold 16 bytes per element.
MEASURED_PARTIAL_OFFLOAD = [(0.5, True, 4, 22.16, 25.45), (0.3, True, 4, 26.69, 20.56), (0.5, True, 32, 92.53, 25.45),
                            (0.3, False, 4, 27.29, 13.92), (0.3, False, 32, 97.65, 13.92), (0.2, False, 4, 28.79, 13.15),
                            (0.2, False, 32, 99.16, 12.08), (0.1, False, 4, 30.30, 11.27), (0.0, False, 4, 33.71, 8.47),
                            (1.0, False, 4, 13.66, 30.07), (1.0, False, 32, 84.02, 30.07)]


@pytest.mark.parametrize("ratio, params_on_host, micro_batch, gpu, host", MEASURED_PARTIAL_OFFLOAD)
def test_partial_offload_within_15_percent_of_measured(ratio, params_on_host, micro_batch, gpu, host):
    run = RunShape(gpus_per_node=1, micro_batch=micro_batch, optimizer_host_share=ratio, params_on_host=params_on_host,
                   sub_group=10**9 if ratio == 1 else 10**8)
    planned = estimate("zero3_offload", ModelShape.from_config(LLAMA_1B), run)
    assert planned.gpu_total / GIB == pytest.approx(gpu, rel=0.15)
    assert planned.host_per_node / GIB == pytest.approx(host, rel=0.15)


def test_partial_offload_moves_the_gpu_sub_groups_states_off_the_host():
    model = ModelShape.from_config(LLAMA_1B)
    full, half = (estimate("zero3_offload", model, RunShape(gpus_per_node=1, optimizer_host_share=r, sub_group=10**8))
                  for r in (1.0, 0.5))
    # 1.35B parameters in 13 sub-groups as DeepSpeed closes them at 1e8 elements: the embedding (104,857,600)
    # alone, then 101,187,584 each (four layers' Linears and a fifth's first Linears), the LM head in the last one;
    # the first int(0.5 * 13) = 6 step on the GPU
    on_gpu = 104_857_600 + 5 * 101_187_584
    assert half.gpu_total - full.gpu_total == 16 * on_gpu
    assert full.host_per_node - half.host_per_node >= 12 * on_gpu


def test_sub_groups_close_as_deepspeed_closes_them():
    from hf_zero.planner import sub_groups

    # a parameter over the size is a sub-group alone; the rest (norms) joins the last; a tied head is left out
    assert sub_groups(100, 10, [12, 4, 4, 4, 3]) == [12, 12, 76]
    assert sub_groups(30, 10, [12, 4, 4, 12]) == [12, 18]
    assert sub_groups(16, 5, [12, 4, 12], ranks=2) == [6, 10]  # each rank's share: 6, 2, 6
    assert sub_groups(25, 10) == [10, 10, 5]


def test_config_placement_reaches_the_bench_planner():
    from hf_zero.config.dotted import optimizer_host_share, params_on_host, sub_group_size

    config = {"zero_optimization": {"stage": 3, "sub_group_size": 1e8, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}}
    assert (optimizer_host_share(config), params_on_host(config), sub_group_size(config, 10**9)) == (0.3, False, 10**8)
    preset = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}}
    assert (optimizer_host_share(preset), params_on_host(preset), sub_group_size(preset, 10**9)) == (1.0, True, 10**9)


@pytest.mark.parametrize("setup, gpus, micro_batch, checkpointing, r, targets, fp32_adapters, measured", MEASURED_LORA)
def test_lora_within_15_percent_of_measured_gpu_peaks(setup, gpus, micro_batch, checkpointing, r, targets, fp32_adapters,
                                                       measured):
    run = RunShape(gpus_per_node=gpus, micro_batch=micro_batch, gradient_checkpointing=checkpointing,
                   lora_r=r, lora_targets=targets, fp32_adapters=fp32_adapters)
    predicted = estimate(setup, ModelShape.from_config(LLAMA_1B), run).gpu_total / GIB
    assert predicted == pytest.approx(measured, rel=0.15)


SMALL_LLAMA = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=2, num_attention_heads=8,
                          vocab_size=64)


def _kept_for_backward(targets, adapter_dtype, deepspeed_linear, tokens=32) -> int:
    """Bytes one decoder layer's forward keeps for its backward (weights aside), counted by autograd's hooks."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = LlamaForCausalLM(SMALL_LLAMA).to(torch.bfloat16)
    if targets:
        model = get_peft_model(model, LoraConfig(r=4, target_modules=list(targets) if targets != ("all-linear",) else "all-linear"))
        for name, param in model.named_parameters():
            if "lora_" in name:  # bf16 as DeepSpeed's ZeRO-1/2 cast leaves them; fp32 as ZeRO-3 leaves them
                param.data = param.data.to(adapter_dtype)
    decoder = (model.get_base_model() if targets else model).model
    hidden = torch.randn(1, tokens, SMALL_LLAMA.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    not_counted = {p.untyped_storage().data_ptr() for p in model.parameters()} | {hidden.untyped_storage().data_ptr()}
    kept = {}

    def pack(tensor):
        if tensor.untyped_storage().data_ptr() not in not_counted:
            kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    positions = torch.arange(tokens)[None]
    linear = contextlib.nullcontext()
    if deepspeed_linear:  # what zero.Init leaves in place of torch's F.linear
        from deepspeed.runtime.zero.linear import zero3_linear_wrap

        linear = mock.patch.object(F, "linear", zero3_linear_wrap)
    with linear, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        decoder.layers[1](hidden, position_embeddings=decoder.rotary_emb(hidden, positions), attention_mask=None,
                          position_ids=positions)
    return sum(kept.values())


@pytest.mark.parametrize("targets", [QV, ("o_proj",), ("all-linear",)])
@pytest.mark.parametrize("zero3, compiled, fp32_adapters", [
    (False, False, False), (True, False, False), (True, False, True), (True, True, False), (True, True, True)],
    ids=["zero2", "zero3", "zero3-fp32-adapters", "zero3-compiled", "zero3-compiled-fp32-adapters"])
def test_lora_activation_saving_is_what_a_frozen_layer_really_keeps(targets, zero3, compiled, fp32_adapters):
    """The planner's LoRA activations, byte for byte: full fine-tuning's count minus a frozen layer's.
    ZeRO-3 compiled: ZeroCallback restores torch's F.linear for compiled blocks (nothing is compiled here);
    fp32 adapters: ZeRO-3 without ZeroCallback's cast."""
    deepspeed_linear = zero3 and not compiled
    full = _kept_for_backward(None, None, deepspeed_linear)
    lora = _kept_for_backward(targets, torch.float32 if fp32_adapters else torch.bfloat16, deepspeed_linear)
    run = RunShape(lora_r=4, lora_targets=targets, compiled=compiled, fp32_adapters=fp32_adapters)
    assert full - lora == frozen_base_saving(ModelShape.from_config(SMALL_LLAMA), run, zero3) * 32


def test_lora_trains_the_adapter_only():
    model = ModelShape.from_config(LLAMA_1B)
    assert model.adapter_params(16, QV) == 24 * 2 * 16 * (2048 + 2048)
    full, lora = (estimate("zero3", model, RunShape(gpus_per_node=2, micro_batch=4, lora_r=r, lora_targets=QV))
                  for r in (0, 16))
    assert lora.gpu["optimizer"] < full.gpu["optimizer"] / 400 and lora.gpu["parameters"] >= full.gpu["parameters"]
    # a model without Llama's layer layout is planned with full fine-tuning's activations (an upper bound)
    other = ModelShape(params=10**9, hidden=1024, intermediate=4096, layers=8, vocab=1000, largest_layer=10**7,
                       linears={"c_attn": (1024, 3072), "c_proj": (1024, 1024)})
    run = RunShape(lora_r=8, lora_targets=("c_attn",))
    assert frozen_base_saving(other, run, zero3=False) == 0
    with pytest.raises(ValueError, match="q_proj are not Linear layers"):
        other.lora_targets(("q_proj",))


def test_zero3_model_states_fall_as_one_over_n():
    model = ModelShape.from_config(LLAMA_8B)
    states = [sum(v for k, v in estimate("zero3", model, RunShape(gpus_per_node=n)).phases["backward"].items()
                  if k in ("parameters", "gradients", "optimizer")) for n in (2, 4, 8)]
    assert states[0] == pytest.approx(2 * states[1], rel=1e-6) == pytest.approx(4 * states[2], rel=1e-6)
    assert states[0] == pytest.approx(16 * model.params / 2, rel=1e-6)


def test_the_peak_phase_is_the_larger_one():
    big, small = ModelShape.from_config(LLAMA_8B), ModelShape.from_config(LLAMA_1B)
    # 7.2B with checkpointing on 2 GPUs: the optimizer step's fp32 gradient copy outweighs the activations
    plan = estimate("zero3", big, RunShape(gpus_per_node=2, micro_batch=2, gradient_checkpointing=True))
    assert plan.phase == "optimizer step" and "activations" not in plan.gpu and plan.gpu["step"] > 5 * GIB
    # 1.35B without checkpointing: the backward's activations and gathered parameters
    plan = estimate("zero3", small, RunShape(gpus_per_node=2, micro_batch=4))
    assert plan.phase == "backward" and plan.gpu["activations"] > 9 * GIB
    # nothing is gathered on one GPU, unless the parameters live on the host
    one = RunShape(gpus_per_node=1, micro_batch=4)
    assert estimate("zero3", small, one).gpu["buffers"] < estimate("zero3_offload", small, one).gpu["buffers"]
    # ZeRO-2 with two overlapping buckets peaks when they fill, after the logits are freed
    assert estimate("zero2_offload", small, one).phase == "first gradient reduce"
    assert estimate("zero2", small, one).phase == "backward"


def test_recommends_least_sharding_that_fits():
    model = ModelShape.from_config(LLAMA_1B)
    run = RunShape(gpus_per_node=2, micro_batch=4)
    assert make_plan(model, run, gpu_mem_gib=80).choice == "ddp"
    plan = make_plan(model, run, gpu_mem_gib=24)
    assert plan.choice == "zero1" and "over 90% of 24 GiB" in plan.reasons["ddp"]
    assert make_plan(model, run, gpu_mem_gib=18).choice == "zero2_offload"
    # zero2_offload's fp32 gradient partition (2.5 GiB a GPU here) does not fit 16 GiB: ZeRO-3 offload does
    assert make_plan(model, run, gpu_mem_gib=16).choice == "zero3_offload"
    assert make_plan(model, run, gpu_mem_gib=16, cpu_mem_gib=8).choice is None


def test_70b_plans_in_seconds(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80,
                                  "intermediate_size": 28672, "vocab_size": 128256, "num_attention_heads": 64,
                                  "num_key_value_heads": 8}))
    started = time.time()
    assert main(["plan", str(config), "--gpus", "8", "--nodes", "2", "--gpu-mem", "80", "--json"]) == 0
    assert time.time() - started < 30
    plan = json.loads(capsys.readouterr().out)
    assert plan["model"]["params"] > 70e9 and plan["choice"] == "zero3_offload"


def test_plot_and_write(tmp_path, capsys):
    png, ds, config = tmp_path / "plan.png", tmp_path / "ds.json", tmp_path / "config.json"
    LLAMA_1B.to_json_file(config)
    assert main(["plan", str(config), "--gpus", "2", "--gpu-mem", "24", "--micro-batch", "4",
                 "--plot", str(png), "--write", str(ds)]) == 0
    out = capsys.readouterr().out
    assert "Recommended:" in out and png.stat().st_size > 10_000
    written = json.loads(ds.read_text())
    assert "Recommended: zero1" in out and written["zero_optimization"]["stage"] == 1
    assert validate_config(written) == []


def test_write_refuses_when_ddp_is_the_answer(tiny_models, tmp_path, capsys):
    assert main(["plan", str(tiny_models["llama"]), "--gpus", "2", "--gpu-mem", "80", "--write",
                 str(tmp_path / "ds.json")]) == 2
    assert "no DeepSpeed config to write" in capsys.readouterr().err
    assert not (tmp_path / "ds.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["plan", "/nonexistent/model", "--gpus", "2", "--gpu-mem", "80"], "cannot read a model config"),
    (["plan", "{config}", "--gpus", "2", "--gpu-mem", "80"], "no model_type"),
])
def test_bad_model_exit_2(tmp_path, capsys, argv, message):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"hidden_size": 8}))
    assert main([a.replace("{config}", str(config)) for a in argv]) == 2
    assert message in capsys.readouterr().err


def test_write_gives_zero3_without_leaf_modules(tmp_path, capsys):
    """A written zero3 config fetches each module on its own: leaf modules from stage3_module_granularity_threshold
    trained differently from DDP on 2 GPUs (docs, presets.md)."""
    config, ds = tmp_path / "config.json", tmp_path / "ds.json"
    LLAMA_8B.to_json_file(config)
    assert main(["plan", str(config), "--gpus", "8", "--gpu-mem", "32", "--write", str(ds)]) == 0
    written = json.loads(ds.read_text())["zero_optimization"]
    assert written["stage"] == 3, capsys.readouterr().out
    assert written.get("stage3_module_granularity_threshold", 0) == 0


def test_plan_for_lora(tmp_path, capsys):
    """--lora-r plans the adapter on the frozen model; a zero3 config written for it keeps layers out of leaf
    modules, which break a frozen base with adapters (the same value ZeroCallback sets)."""
    config, ds = tmp_path / "config.json", tmp_path / "ds.json"
    LLAMA_8B.to_json_file(config)
    argv = ["plan", str(config), "--gpus", "8", "--gpu-mem", "24", "--micro-batch", "2", "--lora-r", "16"]
    assert main([*argv, "--lora-target-modules", "q_proj,v_proj", "--write", str(ds)]) == 0
    out = capsys.readouterr().out
    assert "LoRA r=16 on q_proj,v_proj (6.8M trainable parameters)" in out and "Recommended: zero3" in out
    assert json.loads(ds.read_text())["zero_optimization"].get("stage3_module_granularity_threshold", 0) == 0
    # full fine-tuning of the same model needs its optimizer states off the GPUs
    assert main(["plan", str(config), "--gpus", "8", "--gpu-mem", "24", "--micro-batch", "2"]) == 0
    assert "Recommended: zero3_offload" in capsys.readouterr().out
    assert main([*argv, "--lora-target-modules", "q_proj,qkv"]) == 2
    assert "qkv are not Linear layers" in capsys.readouterr().err
    assert main([*argv[:-1], "-3"]) == 2
    assert "--lora-r must be 0 (full fine-tuning) or a positive rank" in capsys.readouterr().err


def test_a_dpo_reference_model_is_a_whole_copy_under_zero12_and_a_partition_under_zero3():
    from hf_zero.planner import ModelShape, RunShape, estimate

    model = ModelShape(params=1_000_000_000, hidden=2048, intermediate=5504, layers=24, vocab=32000,
                       largest_layer=50_000_000)
    plain, ref = RunShape(gpus_per_node=4), RunShape(gpus_per_node=4, reference_model=True)
    extra = {s: estimate(s, model, ref).gpu_total - estimate(s, model, plain).gpu_total
             for s in ("ddp", "zero2", "zero3", "zero3_offload")}
    assert extra["ddp"] == extra["zero2"] == 2 * model.params  # TRL's stage-0 engine: 16-bit weights on every GPU
    assert extra["zero3"] == 2 * model.params // 4  # partitioned like the policy
    assert extra["zero3_offload"] == 0
    assert estimate("zero3_offload", model, ref).host_per_node - estimate("zero3_offload", model, plain).host_per_node \
        == 2 * model.params // 4 * 4
    lora = RunShape(gpus_per_node=4, reference_model=True, lora_r=16)
    assert estimate("zero2", model, lora).gpu_total == estimate("zero2", model, RunShape(gpus_per_node=4, lora_r=16)).gpu_total


def test_plan_cli_takes_the_reference_model(tmp_path, capsys):
    import json

    from hf_zero.cli import main

    config = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["plan", str(tmp_path), "--gpus", "2", "--gpu-mem", "80", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["plan", str(tmp_path), "--gpus", "2", "--gpu-mem", "80", "--json", "--reference-model"]) == 0
    ref = json.loads(capsys.readouterr().out)
    assert json.dumps(ref) != json.dumps(plain) and "reference model" in json.dumps(ref)


@pytest.mark.parametrize("flags, message", [
    (["--gpus", "-3"], "--gpus must be at least 1, got -3"),
    (["--gpus", "0"], "--gpus must be at least 1, got 0"),
    (["--gpus", "2", "--nodes", "0"], "--nodes must be at least 1"),
    (["--gpus", "2", "--gpu-mem", "-5"], "--gpu-mem must be a positive number of GiB, got -5"),
    (["--gpus", "2", "--gpu-mem", "0"], "--gpu-mem must be a positive number of GiB, got 0"),
    (["--gpus", "2", "--gpu-mem", "nan"], "--gpu-mem must be a positive number of GiB"),
    (["--gpus", "2", "--gpu-mem", "80", "--cpu-mem", "0"], "--cpu-mem must be a positive number"),
    (["--gpus", "2", "--gpu-mem", "80", "--seq", "0"], "--seq must be at least 1"),
    (["--gpus", "2", "--gpu-mem", "80", "--micro-batch", "-1"], "--micro-batch must be at least 1"),
])
def test_plan_refuses_numbers_that_make_no_plan(tmp_path, capsys, flags, message):
    import json

    from hf_zero.cli import main

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                                      "num_hidden_layers": 2, "num_attention_heads": 4,
                                                      "vocab_size": 256}))
    assert main(["plan", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# The plain Trainer (no DeepSpeed; fp32 weights autocast to bf16) on one H200, 1.35B, gradient checkpointing,
# micro batch 1: peak allocated GiB by sequence length (FIELD_NOTES: about 0.56 GiB per 1k tokens)
MEASURED_LONG = [(16_384, 25.92), (65_536, 52.04), (131_072, 88.79), (196_608, 125.55)]
LONG_CONTEXT_ALL = ("tiled_mlp", "fused_loss", "offload_activations")


@pytest.mark.parametrize("seq, measured", MEASURED_LONG)
def test_plain_trainer_long_sequences_within_5_percent_of_measured(seq, measured):
    run = RunShape(gpus_per_node=1, seq=seq, gradient_checkpointing=True)
    assert estimate("ddp", ModelShape.from_config(LLAMA_1B), run).gpu_total / GIB == pytest.approx(measured, rel=0.05)


def test_max_seq_is_the_longest_sequence_that_fits():
    """The bisection over the estimate: the plain Trainer's 1.35B on an H200 fits the measured 192k and not much
    more (about 0.56 GiB per 1k tokens); one token more than the answer does not fit."""
    from dataclasses import replace

    from hf_zero.planner import shortfall

    model, run = ModelShape.from_config(LLAMA_1B), RunShape(gpus_per_node=1, seq=131_072, gradient_checkpointing=True)
    plan = make_plan(model, run, gpu_mem_gib=140)
    assert 196_608 <= plan.max_seq["ddp"] < 210_000
    for setup, longest in plan.max_seq.items():
        fits = [shortfall(estimate(setup, model, replace(run, seq=s)), plan.gpu_capacity, None) is None
                for s in (longest, longest + 1)]
        assert fits == [True, False], setup
    # ZeRO-2 offload keeps 2 bytes per parameter on the GPU instead of 16: longer sequences fit
    assert plan.max_seq["zero2_offload"] > plan.max_seq["ddp"]
    # nothing fits when the model states alone are over the GPU
    assert make_plan(model, run, gpu_mem_gib=16).max_seq["ddp"] is None


def test_each_long_context_part_removes_its_own_term():
    model = ModelShape.from_config(LLAMA_1B)
    tokens = 131_072

    def plain(*parts, **kw):
        return estimate("ddp", model, RunShape(seq=tokens, gradient_checkpointing=True, long_context=parts, **kw))

    base = plain()
    # fused_loss: the three fp32 seq x vocab tensors of the loss's backward are gone
    fused = plain("fused_loss")
    dropped = base.phases["backward"]["activations"] - fused.phases["backward"]["activations"]
    assert base.phase == "backward" and 0.9 * tokens * 12 * model.vocab < dropped < tokens * 12 * model.vocab
    assert fused.phase == "recompute"  # the loss no longer dominates: the first layer recomputed does
    # tiled_mlp: the MLP's intermediates of the layer being recomputed (4 x intermediate, 16-bit) and the two
    # intermediate-wide gradients of its backward, per token; one shard's instead
    tiled = plain("fused_loss", "tiled_mlp")
    saved = fused.phases["recompute"]["activations"] - tiled.phases["recompute"]["activations"]
    assert saved == pytest.approx(tokens * (8 + 4) * model.intermediate, rel=0.1)
    # offload_activations: each layer's fp32 input goes to the host (cos/sin are not saved per layer)
    offload = plain("fused_loss", "tiled_mlp", "offload_activations")
    assert base.host_per_node == PROCESS_HOST_BYTES  # the process itself, nothing offloaded
    assert offload.host_per_node - PROCESS_HOST_BYTES == tokens * model.layers * model.hidden * 4
    assert tiled.gpu_total - offload.gpu_total == pytest.approx(tokens * (model.layers - 1) * model.hidden * 4, rel=0.01)
    # under DeepSpeed the model is 16-bit: half the host bytes, once per GPU of the node
    zero = estimate("zero3_offload", model, RunShape(gpus_per_node=2, seq=tokens, long_context=("offload_activations",)))
    plain_zero = estimate("zero3_offload", model, RunShape(gpus_per_node=2, seq=tokens, gradient_checkpointing=True))
    assert zero.host_per_node - plain_zero.host_per_node == 2 * (offload.host_per_node - PROCESS_HOST_BYTES) // 2
    # offload_activations implies gradient checkpointing
    assert RunShape(long_context=("offload_activations",)).checkpointing
    with pytest.raises(ValueError, match="unknown long-context part"):
        RunShape(long_context=("tiled_loss",))


def test_host_memory_bounds_offloaded_activations():
    """The offloaded inputs count against --cpu-mem: the longest sequence falls when the host is the limit."""
    model = ModelShape.from_config(LLAMA_1B)
    run = RunShape(seq=131_072, long_context=LONG_CONTEXT_ALL)
    roomy, tight = make_plan(model, run, 140, cpu_mem_gib=4096), make_plan(model, run, 140, cpu_mem_gib=16)
    assert tight.max_seq["ddp"] < roomy.max_seq["ddp"]
    host = estimate("ddp", model, replace_seq(run, tight.max_seq["ddp"])).host_per_node
    assert 0.89 * 16 * GIB < host <= 0.9 * 16 * GIB
    assert "26.0 GiB of host memory per node, over 90% of 16 GiB" in tight.reasons["ddp"]  # the inputs at 128k + the process


def test_offloaded_inputs_match_the_h200_pinned_peaks(monkeypatch):
    """zero2 + long context on one H200 (bf16 residual stream): pinned host peak 12.00 GiB at 131,072 tokens and
    24.00 at 262,144 (exact powers of two); at 614,400 torch 2.11 rounded each 2.34 GiB block to 4 GiB: 96.02 GiB."""
    import hf_zero.planner.host_memory as planner

    model = ModelShape.from_config(LLAMA_1B)

    def host(seq):  # pinned: the process's own memory is not
        planned = estimate("zero2", model, RunShape(seq=seq, long_context=LONG_CONTEXT_ALL))
        return (planned.host_per_node - PROCESS_HOST_BYTES) / GIB

    assert host(131_072) == pytest.approx(12.00, rel=0.01) and host(262_144) == pytest.approx(24.00, rel=0.01)
    assert host(614_400) == pytest.approx(56.25, rel=0.01)  # a torch with exact-size pinned blocks
    monkeypatch.setattr(planner, "pinned_blocks_exact", lambda: False)
    assert host(614_400) == pytest.approx(96.02, rel=0.01)


def replace_seq(run, seq):
    from dataclasses import replace

    return replace(run, seq=seq)


def test_sequence_parallel_splits_the_activations():
    model = ModelShape.from_config(LLAMA_1B)
    whole = estimate("zero3", model, RunShape(gpus_per_node=4, seq=32_768, gradient_checkpointing=True))
    split = estimate("zero3", model, RunShape(gpus_per_node=4, seq=131_072, gradient_checkpointing=True,
                                              sequence_parallel=4))
    assert split.gpu == whole.gpu
    plan = make_plan(model, RunShape(gpus_per_node=4, seq=131_072, gradient_checkpointing=True, sequence_parallel=4), 80)
    assert plan.choice != "ddp" and "Ulysses runs under DeepSpeed" in plan.reasons["ddp"]
    assert plan.max_seq["zero3"] % 4 == 0 and plan.max_seq["zero3"] > 3 * plan.max_seq["ddp"]


def test_plan_cli_takes_a_built_in_model_and_reports_max_seq(capsys):
    assert main(["plan", "1.35b", "--gpus", "1", "--gpu-mem", "140", "--seq", "131072", "--gradient-checkpointing"]) == 0
    out = capsys.readouterr().out
    assert "1.35b: 1.35B parameters" in out and "max seq" in out
    ddp = next(line for line in out.splitlines() if line.startswith("ddp"))
    assert "88.7" in ddp and "197," in ddp  # the measured 88.79 GiB; about 200k fit
    assert main(["plan", "1.35b", "--gpus", "1", "--gpu-mem", "140", "--seq", "131072", "--gradient-checkpointing",
                 "--long-context", "fused_loss,tiled_mlp", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["run"]["long_context"] == ["tiled_mlp", "fused_loss"]
    assert all(e["max_seq"] > 131_072 for e in plan["estimates"])
    assert main(["plan", "1.35b", "--gpus", "1", "--gpu-mem", "140", "--cpu-mem", "512", "--long-context"]) == 0
    out = capsys.readouterr().out
    assert "gradient checkpointing, long context: tiled_mlp,fused_loss,offload_activations" in out


@pytest.mark.parametrize("flags, message", [
    (["--gpus", "2", "--sequence-parallel", "0"], "--sequence-parallel must be at least 1, got 0"),
    (["--gpus", "2", "--sequence-parallel", "4"], "--sequence-parallel 4 does not divide the 2 GPU(s)"),
    (["--gpus", "3", "--sequence-parallel", "3"], "does not divide 1.35b's 16 attention heads"),
    (["--gpus", "1", "--long-context", "tiled_mlp,fused_logits"], "--long-context: unknown part 'fused_logits'"),
])
def test_plan_refuses_a_layout_or_part_that_makes_no_plan(capsys, flags, message):
    assert main(["plan", "1.35b", "--gpu-mem", "80", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("error:") == 1


def test_plan_takes_sequence_parallel_that_divides_gpus_and_heads(capsys):
    assert main(["plan", "1.35b", "--gpus", "8", "--gpu-mem", "80", "--sequence-parallel", "8", "--seq", "262144",
                 "--long-context", "tiled_mlp"]) == 0
    assert "sequence parallel 8, long context: tiled_mlp" in capsys.readouterr().out


def test_accumulated_gradients_stay_through_the_next_forward():
    """The plain Trainer on one H200, 1.35B, micro batch 4 x 1024 tokens: 29.73 GiB peak without accumulation,
    34.74 with 16 micro-batches per step (the fp32 gradients of the earlier micro-batches are alive)."""
    model = ModelShape.from_config(LLAMA_1B)
    one = estimate("ddp", model, RunShape(seq=1024, micro_batch=4)).gpu_total / GIB
    sixteen = estimate("ddp", model, RunShape(seq=1024, micro_batch=4, accumulation=16)).gpu_total / GIB
    assert one == pytest.approx(29.73, rel=0.05) and sixteen == pytest.approx(34.74, rel=0.05)
