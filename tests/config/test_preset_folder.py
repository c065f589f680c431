"""A DeepSpeed JSON dropped into recipes/ is a preset everywhere: listed, described, checked, planned from its keys,
written as an Accelerate YAML that Accelerate reads and launches, trainable by name; one DeepSpeed's parser rejects is
listed as broken and never used."""

import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, assert_reload_bitwise, read_result, run_worker, worker_env

# ZeRO-2 with a smaller reduce bucket and overlap_comm on: two 1e8-element buckets, not the zero2 preset's one of 5e8
NEW_PRESET = {**json.loads((REPO / "recipes" / "zero2.json").read_text())}
NEW_PRESET["zero_optimization"] = {**NEW_PRESET["zero_optimization"], "reduce_bucket_size": 100_000_000,
                                   "allgather_bucket_size": 100_000_000, "overlap_comm": True}
README_LOOP = REPO / "tests" / "workers" / "accelerate_readme_loop.py"  # Accelerate's README loop
BROKEN = {"zero_optimization": {"stage": 2, "reduce_bucket_size": "lots"}, "train_micro_batch_size_per_gpu": "auto"}


@pytest.fixture(scope="module")
def installed_copy(tmp_path_factory):
    """hf_zero laid out as a wheel installs it (recipes/ inside as hf_zero.recipes), with two JSONs dropped in."""
    root = tmp_path_factory.mktemp("site")
    ignore = shutil.ignore_patterns("__pycache__")
    # "recipes": a checkout may link hf_zero/recipes to ../recipes (for an editable install); the copy below is the one
    shutil.copytree(REPO / "hf_zero", root / "hf_zero", ignore=shutil.ignore_patterns("__pycache__", "recipes"))
    shutil.copytree(REPO / "recipes", root / "hf_zero" / "recipes", ignore=ignore)
    (root / "hf_zero" / "recipes" / "zero2_small_buckets.json").write_text(json.dumps(NEW_PRESET))
    (root / "hf_zero" / "recipes" / "broken.json").write_text(json.dumps(BROKEN))
    return root


def _hf_zero(root, *args):
    env = worker_env(PYTHONPATH=str(root))
    return subprocess.run([sys.executable, "-m", "hf_zero", *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_copy_is_the_one_imported(installed_copy):
    env = worker_env(PYTHONPATH=str(installed_copy))
    done = subprocess.run([sys.executable, "-c", "import hf_zero.recipes as r; print(r.__file__)"], cwd=installed_copy,
                          env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip().startswith(str(installed_copy))


def test_a_dropped_json_is_listed_described_and_checked_and_a_broken_one_is_listed_as_broken(installed_copy):
    listed = _hf_zero(installed_copy, "presets")
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines() if line.strip() and not line.startswith(("Use", "["))}  # "[": DeepSpeed's log lines
    shipped = sorted(path.stem for path in (REPO / "recipes").glob("*.json"))
    assert set(lines) >= {*shipped, "zero2_small_buckets", "broken"}
    assert list(lines).index("zero2_small_buckets") >= len(shipped)  # without a DESCRIPTIONS line: after them
    assert "ZeRO-2" in lines["zero2_small_buckets"]  # described from its keys
    assert "broken:" in lines["broken"] and "reduce_bucket_size" in lines["broken"]
    assert _hf_zero(installed_copy, "presets", "zero2_small_buckets").stdout.strip().endswith("zero2_small_buckets.json")
    assert _hf_zero(installed_copy, "check", "zero2_small_buckets").returncode == 0
    refused = _hf_zero(installed_copy, "check", "broken")
    assert refused.returncode == 2 and "broken" in refused.stderr and "Traceback" not in refused.stderr


def test_a_dropped_json_is_planned_from_its_keys(installed_copy):
    done = _hf_zero(installed_copy, "plan", "1.35b", "--gpus", "2", "--gpu-mem", "80", "--json")
    assert done.returncode == 0, done.stderr
    estimates = {e["setup"]: e for e in json.loads(done.stdout)["estimates"]}
    assert "broken" not in estimates
    # the zero2 preset holds one 5e8-element bucket at its first reduce; the new one two of 1e8 (bf16)
    assert estimates["zero2"]["phases"]["first gradient reduce"]["buffers"] == 500_000_000 * 2
    assert estimates["zero2_small_buckets"]["phases"]["first gradient reduce"]["buffers"] == 2 * 100_000_000 * 2
    assert set(estimates) >= {"ddp", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "zero3_nvme"}


def test_a_dropped_json_is_written_as_an_accelerate_yaml_accelerate_reads(installed_copy, tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils.deepspeed import HfDeepSpeedConfig

    path = tmp_path / "small.yaml"
    done = _hf_zero(installed_copy, "presets", "zero2_small_buckets", "--accelerate-config", path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(path)
    config = load_config_from_file(str(path))  # as accelerate launch --config_file reads it
    assert config.distributed_type == "DEEPSPEED" and config.deepspeed_config["zero3_init_flag"] is False
    assert HfDeepSpeedConfig(config.deepspeed_config["deepspeed_config_file"]).config == NEW_PRESET
    refused = _hf_zero(installed_copy, "presets", "broken", "--accelerate-config", tmp_path / "broken.yaml")
    assert refused.returncode == 2 and "is broken" in refused.stderr and not (tmp_path / "broken.yaml").exists()


@pytest.mark.multiproc
@pytest.mark.slow  # a two-process ZeRO-2 run, about 40 s
def test_a_dropped_json_trains_by_name(installed_copy, tiny_models, tmp_path):
    out = tmp_path / "run"
    run_worker(["--model", tiny_models["llama"], "--out", out, "--deepspeed", "zero2_small_buckets", "--steps", "2"],
               nproc=2, env={"PYTHONPATH": f"{installed_copy}:{REPO / 'tests'}"})
    result = read_result(out)
    assert result["zero_stage"] == 2 and result["reduce_bucket_size"] == 100_000_000 and result["dp_world_size"] == 2
    assert_reload_bitwise(out)


@pytest.mark.multiproc
@pytest.mark.slow  # a two-process ZeRO-2 run under accelerate launch, about a minute
def test_a_dropped_jsons_written_yaml_launches_accelerates_readme_loop(installed_copy, tiny_models, tmp_path):
    yaml, out = tmp_path / "small.yaml", tmp_path / "loop"
    assert _hf_zero(installed_copy, "presets", "zero2_small_buckets", "--accelerate-config", yaml).returncode == 0
    run_worker(["--model", tiny_models["llama"], "--out", out, "--steps", "2"], nproc=2, launcher=f"accelerate:{yaml}",
               script=README_LOOP, env={"PYTHONPATH": f"{installed_copy}:{REPO / 'tests'}"}, cwd=tmp_path)
    result = read_result(out)
    assert result["zero_stage"] == 2 and result["dp_world_size"] == 2
    zero = result["zero_config"]  # the engine's own config: the dropped-in JSON's buckets, not the zero2 preset's
    assert (zero["reduce_bucket_size"], zero["allgather_bucket_size"], zero["overlap_comm"]) == (100_000_000,) * 2 + (True,)
    assert_reload_bitwise(out)
