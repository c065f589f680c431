"""Config findings: each rule fires on a bad config and stays quiet on a good one."""


import pytest

import hf_zero
from hf_zero.config import validate_config


def codes(config, **kwargs):
    return [f.code for f in validate_config(config, **kwargs)]


@pytest.fixture
def good():
    """The zero3 preset (no GPU-only settings: nothing for hf_zero to drop on CPU)."""
    from hf_zero.config.live import drop_gpu_only_settings

    config = hf_zero.load_config("zero3")
    assert drop_gpu_only_settings(config) == []
    return config


def test_quiet_on_a_preset(good):
    assert codes(good, on_cpu=True) == []
    assert codes(hf_zero.load_config("zero3"), on_cpu=False) == []


def test_leaf_modules_on_cpu_fire_and_are_dropped_for_cpu_runs():
    """A leaf-module threshold (a GPU setting) crashes DeepSpeed on CPU."""
    from hf_zero.config.live import drop_gpu_only_settings

    raw = hf_zero.load_config("zero3")
    raw["zero_optimization"]["stage3_module_granularity_threshold"] = 5_000_000
    assert codes(raw, on_cpu=True) == ["leaf-modules-on-cpu"]
    assert drop_gpu_only_settings(raw) and raw["zero_optimization"]["stage3_module_granularity_threshold"] == 0
    assert codes(raw, on_cpu=True) == [] and drop_gpu_only_settings(raw) == []


def test_deepcompile_with_zero3_warns_about_graph_breaks(good):
    good["compile"] = {"deepcompile": True}
    [finding] = validate_config(good, on_cpu=True)
    assert finding.code == "deepcompile-graph-breaks" and finding.severity == "warning"
    assert "'weight' must be 2-D" in finding.message and "TORCH_LOGS=graph_breaks" in finding.fix
    good["compile"]["deepcompile"] = False
    assert codes(good, on_cpu=True) == []
    zero2 = hf_zero.load_config("zero2")
    zero2["compile"] = {"deepcompile": True}  # no ZeRO-3 gather hooks to lose
    assert codes(zero2, on_cpu=True) == []


def test_top_level_key_deepspeed_ignores(good):
    good["gradient_checkpointing"] = True
    [finding] = validate_config(good)
    assert finding.code == "unknown-key" and "TrainingArguments(activation_checkpointing=True)" in finding.fix


def test_misspelled_nested_key(good):
    good["zero_optimization"]["stage3_gather_16bit_weights_on_model_sav"] = True
    [finding] = validate_config(good)
    assert finding.code == "unknown-key" and "zero_optimization.stage3_gather_16bit_weights_on_model_sav" in finding.message


def test_bad_block_does_not_hide_ignored_keys(good):
    good["zero_optimization"]["offload_param"] = {"device": "gpu"}
    good["nccl_timeout"] = 30
    assert sorted(codes(good)) == ["invalid-value", "unknown-key"]


def test_fp16_on_cpu(good):
    good["fp16"]["enabled"] = True
    assert codes(good, on_cpu=True) == ["fp16-on-cpu"]
    assert codes(good, on_cpu=False) == []


def test_fp16_and_bf16_both_on(good):
    good["fp16"]["enabled"] = True
    good["bf16"]["enabled"] = True
    assert "fp16-and-bf16" in codes(good)


def test_batch_arithmetic(good):
    good.update(train_batch_size=8, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=1)
    assert codes(good, world_size=2) == []
    assert codes(good, world_size=1) == ["batch-arithmetic"]


def test_no_batch_size(good):
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        del good[key]
    assert codes(good) == ["batch-size-missing"]


def test_auto_on_a_key_the_trainer_does_not_fill(good):
    good["zero_optimization"]["sub_group_size"] = "auto"
    assert "auto-unfilled" in codes(good)


def test_zero3_without_gather_warns(good):
    good["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = False
    [finding] = validate_config(good)
    assert (finding.code, finding.severity) == ("zero3-no-gather", "warning")
    with pytest.raises(hf_zero.ConfigError):
        hf_zero.config.check_config({**good, "bogus": 1})
    assert [f.code for f in hf_zero.config.check_config(good)] == ["zero3-no-gather"]


def test_load_config_errors(tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"zero_optimization": ')
    with pytest.raises(hf_zero.ConfigError, match="invalid JSON .* line 1"):
        hf_zero.load_config(bad_json)
    a_list = tmp_path / "list.json"
    a_list.write_text("[1, 2]")
    with pytest.raises(hf_zero.ConfigError, match="not an object"):
        hf_zero.load_config(a_list)
    with pytest.raises(hf_zero.ConfigError, match="no such file"):
        hf_zero.load_config(tmp_path / "missing.json")
    with pytest.raises(hf_zero.ConfigError, match="is a directory"):
        hf_zero.load_config(str(tmp_path) + "/")
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(hf_zero.ConfigError, match="not UTF-8"):
        hf_zero.load_config(binary)


def test_overrides_and_dicts_are_copied(good):
    changed = hf_zero.load_config(good, overrides={"zero_optimization.stage": 2})
    assert changed["zero_optimization"]["stage"] == 2 and good["zero_optimization"]["stage"] == 3


def test_fp16_on_cpu_refused_by_training_args(tmp_path):
    with pytest.raises(hf_zero.ConfigError, match="fp16.*CPU"):
        hf_zero.TrainingArguments(output_dir=str(tmp_path), deepspeed="zero3", fp16=True)


# ---- hf_zero's own rules (hf_zero/config/rules.py) ----------------------------------------------

def test_trainer_mismatch(good):
    good["train_micro_batch_size_per_gpu"] = 8
    assert "trainer-mismatch" in codes(good, trainer_args={"per_device_train_batch_size": 4})
    assert "trainer-mismatch" not in codes(good, trainer_args={"per_device_train_batch_size": 8})


def test_trainer_mismatch_on_gradient_accumulation(good):
    good["gradient_accumulation_steps"] = 4
    [finding] = [f for f in validate_config(good, trainer_args={"gradient_accumulation_steps": 2})
                 if f.code == "trainer-mismatch"]
    assert finding.message.startswith("gradient_accumulation_steps is 4 but the Trainer's gradient_accumulation_steps is 2")
    assert codes(good, trainer_args={"gradient_accumulation_steps": 4}) == []


def test_fp16_for_a_bf16_model(good):
    good["fp16"]["enabled"] = True
    assert codes(good, model_config={"dtype": "bfloat16"}) == ["fp16-for-bf16-model"]
    assert codes(good, model_config={"dtype": "float32"}) == []


def test_fp16_from_trainer_args_on_cpu(good):
    assert codes(good, on_cpu=True, trainer_args={"fp16": True}) == ["fp16-on-cpu"]


def test_stage3_keys_in_stage2_and_the_reverse(good):
    stage2 = hf_zero.load_config("zero2")
    assert codes(stage2) == []
    stage2["zero_optimization"]["stage3_param_persistence_threshold"] = 10
    assert codes(stage2) == ["stage3-key-in-stage12"]
    good["zero_optimization"]["reduce_scatter"] = False  # stage 3 reads it (in-place all-reduce of its buckets)
    assert codes(good) == []
    good["zero_optimization"]["allgather_bucket_size"] = 10
    assert codes(good) == ["stage12-key-in-stage3"]


def test_nvme_path_not_writable(tmp_path):
    config = hf_zero.load_config("zero3_nvme", nvme_path=tmp_path / "missing")
    assert set(codes(config)) == {"nvme-path-unusable"}
    assert codes(hf_zero.load_config("zero3_nvme", nvme_path=tmp_path)) == []


def test_auto_outside_the_trainer(good):
    [finding] = validate_config(good, trainer_fills_auto=False)
    assert finding.code == "auto-outside-trainer" and "only work under the HF Trainer/Accelerate" in finding.message


def test_quiet_outside_the_trainer_without_auto_values(good):
    """Raw DeepSpeed (trainer_fills_auto=False) is fine once every "auto" has a value."""
    from hf_zero.config.findings import fill_auto

    concrete = fill_auto(good)
    assert "auto" not in repr(concrete)
    assert codes(concrete, trainer_fills_auto=False) == []


def test_fix_config_repairs_what_it_can(good):
    from hf_zero.config.rules import fix_config

    bad = dict(good, gradient_checkpointing=True, train_batch_size=7, train_micro_batch_size_per_gpu=2,
               gradient_accumulation_steps=1)
    bad["zero_optimization"] = dict(good["zero_optimization"], allgather_bucket_size=5, bogus=1,
                                    stage3_gather_16bit_weights_on_model_save=False)
    findings = validate_config(bad, world_size=2)
    assert {"unknown-key", "batch-arithmetic", "stage12-key-in-stage3", "zero3-no-gather"} <= {f.code for f in findings}
    fixed = fix_config(bad, findings)
    assert validate_config(fixed, world_size=2) == []
    assert "gradient_checkpointing" not in fixed and "bogus" not in fixed["zero_optimization"]
