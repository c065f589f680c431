"""The planner plans a DeepSpeed config from its keys: the shipped presets keep their figures, a user's config its own."""

import json

import pytest

from hf_zero.cli import main
from hf_zero.config.presets import load_config
from hf_zero.model_configs import build_config, resolve_model
from hf_zero.planner import SETUPS, ModelShape, RunShape, estimate, run_of_config

RUNS = [RunShape(gpus_per_node=2), RunShape(gpus_per_node=1, gradient_checkpointing=True, micro_batch=8, accumulation=4),
        RunShape(gpus_per_node=8, nodes=2, lora_r=16), RunShape(gpus_per_node=4, dtype="fp32", seq=4096)]


@pytest.fixture(scope="module")
def model():
    name, config = resolve_model("1.35b")
    return ModelShape.from_config(build_config(config), name)


@pytest.mark.parametrize("preset", [s for s in SETUPS if s != "ddp"])
def test_each_preset_planned_from_its_keys_gives_the_figures_of_its_name(model, preset):
    for run in RUNS:
        by_name, by_keys = estimate(preset, model, run), estimate(preset, model, run_of_config(run, load_config(preset)))
        assert (by_keys.phases, by_keys.host_per_node, by_keys.nvme_per_node) == \
               (by_name.phases, by_name.host_per_node, by_name.nvme_per_node)


def _plan(capsys, *argv):
    assert main(["plan", "1.35b", "--gpus", "2", "--gpu-mem", "80", "--json", *argv]) == 0
    return {e["setup"]: e for e in json.loads(capsys.readouterr().out)["estimates"]}


def test_a_users_config_is_planned_from_its_keys(capsys, tmp_path):
    config = load_config("zero3_offload")
    config["zero_optimization"]["offload_optimizer"]["ratio"] = 0.3  # 70% of the optimizer stays on the GPU
    config["zero_optimization"]["sub_group_size"] = 100_000_000
    del config["zero_optimization"]["offload_param"]
    path = tmp_path / "my_ds.json"
    path.write_text(json.dumps(config))
    planned = _plan(capsys, "--config", str(path))
    assert list(planned) == ["my_ds"]
    # the same placement as the preset's flags give it
    flags = _plan(capsys, "--offload-ratio", "0.3", "--params-on-gpu", "--sub-group-size", "100000000")
    for key in ("gpu_total", "host_per_node", "phases"):
        assert planned["my_ds"][key] == flags["zero3_offload"][key]
    assert planned["my_ds"]["gpu_total"] > _plan(capsys)["zero3_offload"]["gpu_total"]
    # a preset by name, planned from its keys: today's figures
    assert _plan(capsys, "--config", "zero2")["zero2"]["gpu_total"] == _plan(capsys)["zero2"]["gpu_total"]


@pytest.mark.parametrize("argv, words", [
    (["--config", "{tmp}/missing.json"], "does not exist"),
    (["--config", "{tmp}/stage0.json"], "zero_optimization.stage is 0 or missing"),
    (["--config", "zero3_offload", "--offload-ratio", "0.5"], "with --config the config's own keys"),
    (["--config", "zero9"], "unknown preset"),
])
def test_plan_config_bad_input_is_one_message_and_exit_2(capsys, tmp_path, argv, words):
    (tmp_path / "stage0.json").write_text(json.dumps({"zero_optimization": {"stage": 0}}))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["plan", "1.35b", "--gpus", "2", "--gpu-mem", "80", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err
