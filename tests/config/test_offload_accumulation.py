"""ZeRO-2 offload accumulating 16-bit gradients on the host (DeepSpeed's default without data_types.grad_accum_dtype):
a warning with the fp32 fix where a run accumulates in 16 bits, quiet everywhere else."""

import pytest

from hf_zero.config.presets import load_config
from hf_zero.config.validate import validate_config

CODE = "offload-16bit-accumulation"


def _codes(config, **trainer_args):
    return {f.code: f for f in validate_config(config, on_cpu=False, world_size=1, trainer_args=trainer_args)}


def _without_fp32_accumulation(preset="zero2_offload"):
    config = load_config(preset)
    config.pop("data_types", None)
    return config


def test_fires_on_zero2_offload_accumulating_in_bf16():
    found = _codes(_without_fp32_accumulation(), gradient_accumulation_steps=16, bf16=True)
    assert found[CODE].severity == "warning" and "16 micro-batches in 16 bits" in found[CODE].message
    assert '"data_types": {"grad_accum_dtype": "fp32"}' in found[CODE].fix


def test_fires_with_the_values_written_in_the_config():
    config = _without_fp32_accumulation()
    config.update(gradient_accumulation_steps=4, train_micro_batch_size_per_gpu=2, train_batch_size=8)
    config["bf16"]["enabled"] = True
    assert CODE in _codes(config)


@pytest.mark.parametrize("change, trainer_args", [
    (None, {"gradient_accumulation_steps": 16, "bf16": True}),  # the preset as shipped accumulates in fp32
    ("strip", {"gradient_accumulation_steps": 1, "bf16": True}),  # nothing to accumulate
    ("strip", {"gradient_accumulation_steps": 16, "bf16": False}),  # fp32 training: fp32 sums
    ("strip", {"gradient_accumulation_steps": 16}),  # "auto" precision, no arguments to say which
    ("strip", {}),  # "auto" accumulation, no arguments
    ("float32", {"gradient_accumulation_steps": 16, "bf16": True}),  # another spelling of fp32
])
def test_quiet_where_the_sum_is_fp32_or_unknown(change, trainer_args):
    config = load_config("zero2_offload") if change is None else _without_fp32_accumulation()
    if change == "float32":
        config["data_types"] = {"grad_accum_dtype": "float32"}
    assert CODE not in _codes(config, **trainer_args)


@pytest.mark.parametrize("preset", ["zero2", "zero3_offload"])
def test_quiet_without_zero2_offload(preset):
    assert CODE not in _codes(load_config(preset), gradient_accumulation_steps=16, bf16=True)


def test_half_precision_reads_the_config_then_the_trainer_flags():
    from hf_zero.config.dotted import half_precision

    auto = load_config("zero2")  # bf16 and fp16 both "auto"
    assert half_precision(auto, {"bf16": True, "fp16": False}) == "bf16"
    assert half_precision(auto, {"bf16": False, "fp16": True}) == "fp16"
    assert half_precision(auto, {"bf16": False, "fp16": False}) is None
    assert half_precision(auto, {}) == "auto"  # no arguments to say which
    assert half_precision({"fp16": {"enabled": True}}, {}) == "fp16"
    assert half_precision({}, {"bf16": True}) is None  # DeepSpeed trains in fp32 without the config's switch
