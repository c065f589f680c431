"""The planner's layouts come from one table keyed by what a DeepSpeed config says (ZeRO stage, offload_optimizer and
offload_param devices): a config of another combination is refused naming it, and a preset dropped into recipes/ is
planned from its keys exactly as the shipped one it copies."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, worker_env
from hf_zero.cli import main

ZERO1 = json.loads((REPO / "recipes" / "zero1.json").read_text())
# ZeRO-1 with its optimizer on the host: DeepSpeed runs it (offload_optimizer is valid for stages 1, 2 and 3), the
# planner has no count for it
ZERO1_OFFLOAD = {**ZERO1, "zero_optimization": {**ZERO1["zero_optimization"],
                                                "offload_optimizer": {"device": "cpu", "pin_memory": True}}}
SHIPPED = ("zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "zero3_nvme")


@pytest.fixture(scope="module")
def installed_copy(tmp_path_factory):
    """hf_zero laid out as a wheel installs it (recipes/ inside as hf_zero.recipes), each shipped preset also dropped
    in under another name."""
    root = tmp_path_factory.mktemp("site")

    def ignore(folder, names):  # a checkout's hf_zero/recipes link, where there is one, is replaced below
        return [n for n in names if n == "__pycache__" or (Path(folder) == REPO / "hf_zero" and n == "recipes")]

    shutil.copytree(REPO / "hf_zero", root / "hf_zero", ignore=ignore)
    shutil.copytree(REPO / "recipes", root / "hf_zero" / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    for name in SHIPPED:
        shutil.copy(REPO / "recipes" / f"{name}.json", root / "hf_zero" / "recipes" / f"my_{name}.json")
    return root


def _hf_zero(root, *args):
    return subprocess.run([sys.executable, "-m", "hf_zero", *args], cwd=root, env=worker_env(PYTHONPATH=str(root)),
                          capture_output=True, text=True, timeout=300)


def _one_line_naming_the_layout(err: str) -> None:
    assert "ZeRO-1 with offload_optimizer on cpu" in err and "does not model" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err, err


def test_plan_refuses_a_zero1_offload_config_passed_by_path(tmp_path, capsys):
    path = tmp_path / "zero1_offload.json"
    path.write_text(json.dumps(ZERO1_OFFLOAD))
    assert main(["plan", "1.35b", "--gpus", "2", "--gpu-mem", "80", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    _one_line_naming_the_layout(err)
    assert str(path) in err


def test_plan_refuses_a_zero1_offload_preset_dropped_into_recipes(installed_copy):
    dropped = installed_copy / "hf_zero" / "recipes" / "zero1_offload.json"
    dropped.write_text(json.dumps(ZERO1_OFFLOAD))
    try:
        done = _hf_zero(installed_copy, "plan", "1.35b", "--gpus", "2", "--gpu-mem", "80")
    finally:
        dropped.unlink()
    assert done.returncode == 2, done.stdout + done.stderr
    err = "".join(line + "\n" for line in done.stderr.splitlines() if not line.startswith("["))  # "[": DeepSpeed's logs
    _one_line_naming_the_layout(err)
    assert "preset 'zero1_offload'" in err


def test_a_renamed_copy_of_each_shipped_preset_is_planned_as_the_shipped_one(installed_copy):
    done = _hf_zero(installed_copy, "plan", "1.35b", "--gpus", "2", "--gpu-mem", "80", "--cpu-mem", "512",
                    "--gradient-checkpointing", "--json")
    assert done.returncode == 0, done.stderr
    estimates = {e["setup"]: e for e in json.loads(done.stdout)["estimates"]}
    for name in SHIPPED:
        shipped, copy = estimates[name], estimates[f"my_{name}"]
        for key in ("phases", "host_per_node", "nvme_per_node", "max_seq"):
            assert copy[key] == shipped[key], (name, key)


def _config(key) -> dict | None:
    """A DeepSpeed config whose table key is ``key`` (None: no config)."""
    if key is None:
        return None
    stage, optimizer, params = key
    zero = {"stage": stage}
    for block, device in (("offload_optimizer", optimizer), ("offload_param", params)):
        if device != "none":
            zero[block] = {"device": device, "nvme_path": "/tmp"} if device == "nvme" else {"device": device}
    return {"zero_optimization": zero}


# what the planner models: DDP (no DeepSpeed config) and the shipped presets' layouts, ZeRO-3 with the optimizer alone on
# the host among them (offload_optimizer.ratio and the parameters on the GPU, docs/offload.md)
MODELED = {None: "ddp", (1, "none", "none"): "zero1", (2, "none", "none"): "zero2", (2, "cpu", "none"): "zero2_offload",
           (3, "none", "none"): "zero3", (3, "cpu", "cpu"): "zero3_offload", (3, "cpu", "none"): "zero3_offload",
           (3, "nvme", "nvme"): "zero3_nvme"}


@pytest.mark.parametrize("key, name", MODELED.items())
def test_every_modeled_layout_is_planned(key, name):
    from hf_zero.planner import ModelShape, RunShape, estimate, layout_of_config, run_of_config
    from hf_zero.model_configs import build_config, resolve_model

    model = ModelShape.from_config(build_config(resolve_model("tiny")[1]))
    config = _config(key)
    layout = layout_of_config(config)
    assert layout.name == name
    run = RunShape(gpus_per_node=2) if config is None else run_of_config(RunShape(gpus_per_node=2), config)
    assert estimate(layout, model, run).gpu_total > 0


def test_a_shipped_preset_is_its_own_layout():
    from hf_zero.config.presets import load_config
    from hf_zero.planner import layout_of_config

    for name in SHIPPED:
        assert layout_of_config(load_config(name, nvme_path="/tmp")).name == name


# combinations DeepSpeed runs that the table does not model
UNMODELED = [(1, "cpu", "none"), (1, "nvme", "none"), (2, "nvme", "none"), (3, "none", "cpu"), (3, "none", "nvme"),
             (3, "cpu", "nvme"), (3, "nvme", "cpu"), (3, "nvme", "none")]


@pytest.mark.parametrize("key", UNMODELED)
def test_a_combination_the_table_does_not_model_is_refused_naming_it(key):
    from hf_zero.errors import ConfigError
    from hf_zero.planner import describe, host_memory_problem, layout_of_config

    with pytest.raises(ConfigError, match="does not model") as refused:
        layout_of_config(_config(key), source="my.json")
    assert str(refused.value).startswith(f"my.json: {describe(key)} is a layout")
    # the run-time host-memory check has no figure for it, and stays quiet
    assert host_memory_problem(_config(key), 10**10, 10**10, 1, 1, 2, 1) is None


def test_offload_param_below_stage_3_is_the_layout_without_it():
    """DeepSpeed reads offload_param at stage 3 only: ZeRO-1/2 keep every parameter on each GPU whatever it says."""
    from hf_zero.planner import layout_of_config

    for stage, optimizer, layout in ((1, "none", "zero1"), (2, "none", "zero2"), (2, "cpu", "zero2_offload")):
        for params in ("cpu", "nvme"):
            assert layout_of_config(_config((stage, optimizer, params))).name == layout
