"""The shipped presets: valid for DeepSpeed, "auto" wherever the Trainer has a value, shipped in the wheel.

Every test here finds the presets in recipes/: a JSON dropped there is tested without editing this file."""

import json
import re
from pathlib import Path

import pytest
import yaml

import hf_zero
from hf_zero.config import validate_config
from hf_zero.config.dotted import get_dotted

REPO = Path(__file__).resolve().parents[2]
# read from the folder itself, not from hf_zero's listing, so that a preset the listing missed still fails here
PRESETS = sorted(path.stem for path in (REPO / "recipes").glob("*.json"))
TRAINER_KEYS = ["train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "gradient_clipping",
                "bf16.enabled", "fp16.enabled"]
STORED_YAMLS = sorted((REPO / "recipes" / "accelerate").glob("*.yaml"))  # the launch-only ones


def test_every_json_in_recipes_is_listed_described_ones_first():
    from hf_zero.recipes import DESCRIPTIONS

    assert sorted(hf_zero.preset_names()) == PRESETS
    described = [name for name in DESCRIPTIONS if name in PRESETS]
    assert hf_zero.preset_names()[: len(described)] == described
    assert set(DESCRIPTIONS) <= set(PRESETS), "a DESCRIPTIONS line without its JSON in recipes/"


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


@pytest.mark.parametrize("name", [p for p in PRESETS if json.loads((REPO / "recipes" / f"{p}.json").read_text())
                                  ["zero_optimization"]["stage"] == 3])
def test_zero3_presets_gather_16bit_weights_on_save(name):
    assert get_dotted(hf_zero.load_config(name), "zero_optimization.stage3_gather_16bit_weights_on_model_save") is True


def test_nvme_path_comes_from_an_override_never_hard_coded(tmp_path):
    raw = hf_zero.load_config("zero3_nvme")
    assert get_dotted(raw, "zero_optimization.offload_param.nvme_path") is None
    codes = [f.code for f in validate_config(raw, on_cpu=True)]
    assert codes == ["nvme-path-missing", "nvme-path-missing"]
    filled = hf_zero.load_config("zero3_nvme", nvme_path=tmp_path)
    assert get_dotted(filled, "zero_optimization.offload_optimizer.nvme_path") == str(tmp_path)


def accelerate_reads(path: Path):
    """(Accelerate's config, the DeepSpeed config inline in it), read as ``accelerate launch --config_file`` does."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils.deepspeed import HfDeepSpeedConfig

    config = load_config_from_file(str(path))  # Accelerate's own reader
    assert config.distributed_type == "DEEPSPEED"
    value = config.deepspeed_config["deepspeed_config_file"]
    assert "\n" not in value  # one line: launchers pass it on as an environment variable
    assert "recipes/" not in value and ".json" not in value  # no path that only resolves from one directory
    return config, HfDeepSpeedConfig(value).config


@pytest.mark.parametrize("name", PRESETS)
def test_every_presets_accelerate_yaml_is_written_from_its_json(name, tmp_path):
    path = tmp_path / f"{name}.yaml"
    path.write_text(hf_zero.accelerate_config_text(name))
    config, deepspeed_config = accelerate_reads(path)
    assert deepspeed_config == json.loads(hf_zero.preset_path(name).read_text())
    assert config.deepspeed_config["zero3_init_flag"] is (deepspeed_config["zero_optimization"]["stage"] == 3)
    assert config.num_machines == 1 and config.machine_rank == 0


def test_no_stored_yaml_shadows_a_preset():
    """A preset's YAML is written from its JSON, never stored: a second copy would drift from it."""
    assert not {path.stem for path in STORED_YAMLS} & set(PRESETS)
    with pytest.raises(hf_zero.ConfigError, match="no stored Accelerate YAML.*accelerate_config_text"):
        hf_zero.accelerate_config_path("zero3")


@pytest.mark.parametrize("path", STORED_YAMLS, ids=lambda p: p.stem)
def test_a_stored_accelerate_yaml_carries_exactly_the_json_it_names(path):
    """Each launch-only YAML holds a preset's JSON inline (it names which in its header): the same settings, key for
    key, read as Accelerate reads them. Fix a mismatch by writing the YAML again from the JSON: hf_zero.config.
    accelerate_yaml.inline_deepspeed_config(path.read_text(), hf_zero.load_config(name))."""
    [name] = re.findall(r"holds recipes/(\w+)\.json inline", path.read_text())
    assert name in PRESETS and path.stem.startswith(f"{name}_")
    config, deepspeed_config = accelerate_reads(path)
    assert deepspeed_config == json.loads(hf_zero.preset_path(name).read_text())
    assert config.deepspeed_config["zero3_init_flag"] is (deepspeed_config["zero_optimization"]["stage"] == 3)


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
