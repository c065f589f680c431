"""The shipped presets: valid for DeepSpeed, "auto" wherever the Trainer has a value, shipped in the wheel."""

import json
import re
from pathlib import Path

import pytest
import yaml

import hf_zero
from hf_zero.config import validate_config
from hf_zero.config.dotted import get_dotted

PRESETS = list(hf_zero.preset_descriptions())
TRAINER_KEYS = ["train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "gradient_clipping",
                "bf16.enabled", "fp16.enabled"]
YAMLS = sorted((Path(hf_zero.accelerate_config_path("zero3")).parent).glob("*.yaml"))


def test_all_six_presets_ship():
    assert PRESETS == ["zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "zero3_nvme"]


@pytest.mark.parametrize("name", PRESETS)
def test_preset_passes_deepspeeds_own_parser(name, tmp_path):
    config = hf_zero.load_config(name, nvme_path=tmp_path)
    assert validate_config(config, on_cpu=False, world_size=2) == []
    assert validate_config(config, on_cpu=True, world_size=2) == []


@pytest.mark.parametrize("name", PRESETS)
def test_every_trainer_value_is_auto(name):
    config = hf_zero.load_config(name)
    for key in TRAINER_KEYS:
        assert get_dotted(config, key) == "auto", f"{name}: {key}"
    # the Trainer's own scheduler (--lr_scheduler_type) must stay in charge
    assert "scheduler" not in config
    # and the optimizer the code passes: Accelerate refuses a torch optimizer beside a config's optimizer block
    assert "optimizer" not in config


@pytest.mark.parametrize("name", PRESETS)
def test_buckets_are_not_hfs_tiny_auto_sizes(name):
    config = hf_zero.load_config(name)
    assert get_dotted(config, "zero_optimization.reduce_bucket_size") >= 500_000_000


@pytest.mark.parametrize("name", [p for p in PRESETS if p.startswith("zero3")])
def test_zero3_presets_gather_16bit_weights_on_save(name):
    assert get_dotted(hf_zero.load_config(name), "zero_optimization.stage3_gather_16bit_weights_on_model_save") is True


def test_nvme_path_comes_from_an_override_never_hard_coded(tmp_path):
    raw = hf_zero.load_config("zero3_nvme")
    assert get_dotted(raw, "zero_optimization.offload_param.nvme_path") is None
    codes = [f.code for f in validate_config(raw, on_cpu=True)]
    assert codes == ["nvme-path-missing", "nvme-path-missing"]
    filled = hf_zero.load_config("zero3_nvme", nvme_path=tmp_path)
    assert get_dotted(filled, "zero_optimization.offload_optimizer.nvme_path") == str(tmp_path)


def test_every_preset_has_its_accelerate_yaml():
    assert {path.stem for path in YAMLS} >= set(PRESETS) and all(hf_zero.accelerate_config_path(n).exists() for n in PRESETS)


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.stem)
def test_accelerate_yaml_carries_exactly_its_json(path):
    """Each YAML holds a preset's JSON inline (it names which in its header): the same settings, key for key, read
    as Accelerate reads them. Fix a mismatch by writing the YAML again from the JSON: hf_zero.config.accelerate_yaml.
    inline_deepspeed_config(path.read_text(), hf_zero.load_config(name))."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils.deepspeed import HfDeepSpeedConfig

    text = path.read_text()
    [name] = re.findall(r"holds recipes/(\w+)\.json inline", text)
    assert name in PRESETS and (path.stem == name or path.stem.startswith(f"{name}_"))
    config = load_config_from_file(str(path))  # Accelerate's own reader, as accelerate launch reads the file
    assert config.distributed_type == "DEEPSPEED"
    value = config.deepspeed_config["deepspeed_config_file"]
    assert "\n" not in value  # one line: launchers pass it on as an environment variable
    assert HfDeepSpeedConfig(value).config == json.loads(hf_zero.preset_path(name).read_text())
    assert config.deepspeed_config["zero3_init_flag"] is name.startswith("zero3")
    assert "recipes/" not in value and ".json" not in value  # no path that only resolves from one directory


def test_preset_path_and_unknown_name():
    assert hf_zero.preset_path("zero3").name == "zero3.json"
    assert json.loads(hf_zero.preset_path("zero2").read_text())["zero_optimization"]["stage"] == 2
    with pytest.raises(hf_zero.ConfigError, match="unknown preset 'zero9'.*zero1, zero2"):
        hf_zero.preset_path("zero9")


def test_a_launched_config_is_read_as_accelerate_reads_it(tmp_path):
    import base64

    from hf_zero.config.accelerate_yaml import launched_deepspeed_config

    config = hf_zero.load_config("zero2")
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    assert launched_deepspeed_config(str(path)) == str(path)  # a file stays a path: messages name it
    assert launched_deepspeed_config(json.dumps(config)) == config
    assert launched_deepspeed_config(base64.urlsafe_b64encode(json.dumps(config).encode()).decode()) == config
    assert launched_deepspeed_config("nowhere/zero2.json") == "nowhere/zero2.json"  # missing: load_config says so
    with pytest.raises(hf_zero.ConfigError, match="nowhere/zero2.json"):
        hf_zero.load_config(launched_deepspeed_config("nowhere/zero2.json"))


def test_a_yaml_without_a_deepspeed_config_line_is_refused_with_a_fix():
    from hf_zero.config.accelerate_yaml import inline_deepspeed_config

    with pytest.raises(hf_zero.ConfigError, match="no deepspeed_config_file line.*Fix:"):
        inline_deepspeed_config("distributed_type: MULTI_GPU\n", {"zero_optimization": {"stage": 2}})
    written = inline_deepspeed_config("deepspeed_config:\n  deepspeed_config_file: ds.json\n", {"a": "it's"})
    assert yaml.safe_load(written)["deepspeed_config"]["deepspeed_config_file"] == '{ "a": "it\'s" }'


def test_preset_name_of_a_launched_config():
    from hf_zero.config.presets import preset_name_of

    assert preset_name_of(hf_zero.load_config("zero3_offload")) == "zero3_offload"
    assert preset_name_of(hf_zero.load_config("zero3", overrides={"zero_optimization.stage": 2})) is None
