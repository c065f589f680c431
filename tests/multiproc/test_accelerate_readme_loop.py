"""Accelerate's README loop (a torch optimizer or a DummyOptim, ``accelerator.prepare``, ``accelerator.backward``,
``accelerator.get_state_dict`` + ``save_pretrained``) under the presets' Accelerate YAMLs (written from their JSON as
``hf-zero presets NAME --accelerate-config FILE`` writes them) and the stored launch-only YAMLs, launched from a
directory other than the checkout, on 2 CPU processes: it trains with the preset's settings in the engine and reloads
bitwise."""

import json
import subprocess
import sys

import pytest

from conftest import REPO, assert_reload_bitwise, launcher_script, missing, read_result, run_nodes, run_worker, worker_env
from test_zero_training import _aio_available
from hf_zero.config.live import LEAF_THRESHOLD
from hf_zero.distributed import free_port

pytestmark = pytest.mark.multiproc
README_LOOP = REPO / "tests" / "workers" / "accelerate_readme_loop.py"
YAMLS = REPO / "recipes" / "accelerate"


def _json(preset):
    return json.loads((REPO / "recipes" / f"{preset}.json").read_text())


def _run(tiny_models, tmp_path, yaml, *flags):
    """The README loop launched with ``yaml`` (a preset's name, or a YAML's absolute path) from tmp_path/run, where no
    recipes/ folder is."""
    cwd, out = tmp_path / "run", tmp_path / "loop"
    cwd.mkdir(exist_ok=True)
    run_worker(["--model", tiny_models["llama"], "--out", out, *flags], nproc=2, launcher=f"accelerate:{yaml}",
               script=README_LOOP, cwd=cwd)
    return read_result(out), out


def _mismatches(expected: dict, engine: dict, prefix="zero_optimization") -> list:
    """Every setting of the preset's zero_optimization block that the engine's own config does not hold."""
    found = []
    for key, value in expected.items():
        if isinstance(value, dict):
            found += _mismatches(value, engine.get(key) or {}, f"{prefix}.{key}")
        elif engine.get(key) != value:
            found.append(f"{prefix}.{key}: preset {value!r}, engine {engine.get(key)!r}")
    return found


def assert_trained_with_the_preset(result, preset, optimizer, *, dp=2):
    expected = _json(preset)["zero_optimization"]
    if LEAF_THRESHOLD in expected:
        expected[LEAF_THRESHOLD] = 0  # the GPU-only fast path hf_zero.accelerator() turns off on CPU (it crashes there)
    assert result["engine"] == "DeepSpeedEngine" and result["dp_world_size"] == dp
    assert result["zero_stage"] == expected["stage"]
    assert _mismatches(expected, result["zero_config"]) == []  # the tuned buckets/persistence reached the engine
    assert result["optimizer"] == optimizer
    assert result["betas"] == [0.9, 0.95] and result["eps"] == 1e-6  # the script's, not the defaults
    assert result["losses"][-1] < result["losses"][0]


def test_readme_loop_with_torch_adamw_under_zero3_yaml_from_another_directory(tiny_models, tmp_path):
    result, out = _run(tiny_models, tmp_path, "zero3")
    assert_trained_with_the_preset(result, "zero3", "AdamW")
    assert_reload_bitwise(out)


# the offload presets run DeepSpeed's CPU Adam with a torch AdamW too: Accelerate swaps it in, as for the Trainer
@pytest.mark.slow  # about 30-60 s each on 2 cores
@pytest.mark.parametrize("preset, optimizer", [("zero1", "AdamW"), ("zero2", "AdamW"),
                                               ("zero2_offload", "DeepSpeedCPUAdam"),
                                               ("zero3_offload", "DeepSpeedCPUAdam")])
def test_readme_loop_with_torch_adamw_under_each_yaml(tiny_models, tmp_path, preset, optimizer):
    result, out = _run(tiny_models, tmp_path, preset)
    assert_trained_with_the_preset(result, preset, optimizer)
    assert_reload_bitwise(out)


def test_readme_loop_under_the_sequence_parallel_yaml_trains_on_the_whole_sequences_loss(tiny_models, tmp_path):
    # zero3_sp: the zero3 preset with Ulysses over both processes. The loop is unchanged: hf_zero.accelerator()'s
    # prepare adds the batches' position_ids and makes model(**batch).loss the loss over both shards of a sequence
    result, out = _run(tiny_models, tmp_path, YAMLS / "zero3_sp.yaml")
    assert result["engine"] == "DeepSpeedEngine" and result["zero_stage"] == 3
    assert result["sequence_parallel_size"] == 2 and result["optimizer"] == "AdamW"
    # each rank's first loss is the loss of rank 0's first batch, whole sequences, as one process computes it
    # (the loop's data: 4 sequences of 16 tokens from seed 0, batches of 2; the adapter trains rank 0's first)
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"], dtype=torch.float32)
    ids = torch.randint(3, model.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))[:2]
    with torch.no_grad():
        whole = model(input_ids=ids, labels=ids).loss.item()
    assert result["losses_per_rank"] == [pytest.approx(whole, rel=1e-5)] * 2
    assert result["losses"][-1] < result["losses"][0]
    assert_reload_bitwise(out)


@pytest.mark.slow
@pytest.mark.parametrize("preset, optimizer", [("zero3", "FusedAdam"), ("zero2_offload", "DeepSpeedCPUAdam")])
def test_readme_loop_with_dummy_optim_gets_deepspeeds_adamw(tiny_models, tmp_path, preset, optimizer):
    result, out = _run(tiny_models, tmp_path, preset, "--optimizer", "dummy")
    assert_trained_with_the_preset(result, preset, optimizer)
    assert_reload_bitwise(out)


@pytest.mark.nvme
@pytest.mark.slow
def test_readme_loop_under_the_nvme_yaml_written_with_a_folder(tiny_models, tmp_path):
    # zero3_nvme ships without a folder: hf-zero presets writes a copy of its YAML with one inline
    if not _aio_available():
        missing("libaio", "apt-get install -y libaio-dev; .ci/run installs it")
    nvme, yaml = tmp_path / "nvme", tmp_path / "zero3_nvme.yaml"
    nvme.mkdir()
    subprocess.run([sys.executable, "-m", "hf_zero", "presets", "zero3_nvme", "--nvme-path", str(nvme),
                    "--accelerate-config", str(yaml)], check=True, env=worker_env(), cwd=tmp_path)
    result, out = _run(tiny_models, tmp_path, yaml)
    assert result["zero_config"]["offload_param"]["nvme_path"] == str(nvme)
    assert list(nvme.glob("zero_stage_3/*/rank*")), "DeepSpeed set up no swap folder under nvme_path"
    assert result["optimizer"] == "DeepSpeedCPUAdam" and result["losses"][-1] < result["losses"][0]
    assert_reload_bitwise(out)


@pytest.mark.long  # two launchers rendezvousing: about a minute
@pytest.mark.slow
def test_readme_loop_under_the_multinode_yaml_on_two_local_nodes(tiny_models, tmp_path):
    # the YAML's placeholders overridden on each "machine" as a user does; 1 process per node, from another directory
    out, port = tmp_path / "loop", free_port()
    cmds = [[launcher_script("accelerate"), "launch", "--config_file", str(YAMLS / "zero3_multinode.yaml"),
             "--num_processes", "2", "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1",
             "--main_process_port", str(port), str(README_LOOP), "--model", str(tiny_models["llama"]), "--out", str(out)]
            for rank in (0, 1)]
    run_nodes(cmds, cwd=tmp_path)
    assert_trained_with_the_preset(read_result(out), "zero3", "AdamW")
    assert_reload_bitwise(out)
