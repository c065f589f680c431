"""Ulysses sequence parallelism on 2 CPU processes (gloo) through the real Trainer, ZeRO-3 and DeepSpeed's
UlyssesSPAttentionHF: SP=2 trains exactly as one process does on the same batches."""

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO, assert_same_losses, read_result, run_worker

pytestmark = pytest.mark.multiproc

SP_WORKER = REPO / "tests" / "workers" / "train_sp.py"


@pytest.fixture(scope="module")
def one_process(tiny_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("sp1")
    run_worker(["--model", tiny_models["llama"], "--out", out, "--sp", "1"], script=SP_WORKER, timeout=600)
    return out


def _relative_error(got, want) -> float:
    """Largest difference of two tensors, as a fraction of the reference tensor's largest entry."""
    return ((got - want).abs().max() / want.abs().max()).item()


def assert_same_training(sp_out, reference):
    result, plain = read_result(sp_out), read_result(reference)
    assert result["engine"] == "DeepSpeedEngine" and result["sequence_parallel_size"] == 2
    assert result["seq_dp_world_size"] == 2 and result["train_batch_size"] == plain["train_batch_size"] == 2
    # each rank ran its half of every sequence (positions kept), and the halves are the one-process batch
    ranks = [json.loads((sp_out / f"rank{r}.json").read_text()) for r in (0, 1)]
    whole = json.loads((reference / "rank0.json").read_text())
    assert len(ranks[0]) == len(whole) == 3
    for first, second, one in zip(*ranks, whole):
        assert first["position_ids"][0] == list(range(8)) and second["position_ids"][0] == list(range(8, 16))
        assert [a + b for a, b in zip(first["input_ids"], second["input_ids"])] == one["input_ids"]
    # fp32 on CPU: measured 3e-7 (losses), 2.5e-7 (gradients), 1.0e-5 (weights after 3 AdamW steps, which
    # normalise each gradient entry and so magnify the differences of the tiniest ones)
    assert_same_losses(result["losses"], plain["losses"], "sequence parallel, one process")
    for name, (tolerance, file) in {"gradients": (1e-5, "grads"), "weights": (1e-4, "expected")}.items():
        got, want = load_file(str(sp_out / f"{file}.safetensors")), load_file(str(reference / f"{file}.safetensors"))
        assert set(got) == set(want) and want
        worst = max(_relative_error(got[k], want[k]) for k in want)
        assert worst <= tolerance, f"{name} differ by {worst:.2e} of their largest entry"
        assert all(want[k].abs().max() > 0 for k in want)


@pytest.mark.slow  # two runs, 10 s + 15 s on 2 cores
def test_sp2_trains_as_one_process(tiny_models, one_process, tmp_path):
    run_worker(["--model", tiny_models["llama"], "--out", tmp_path, "--sp", "2"], nproc=2, script=SP_WORKER,
               timeout=600)
    assert_same_training(tmp_path, one_process)


@pytest.mark.slow
def test_zero3_sp_accelerate_yaml_trains_as_one_process(tiny_models, one_process, tmp_path):
    # no parallelism_config in the script: the YAML's parallelism_config block turns SP on. Launched from a
    # directory without recipes/: the YAML carries its DeepSpeed config inline
    (tmp_path / "run").mkdir()
    run_worker(["--model", tiny_models["llama"], "--out", tmp_path, "--sp", "0", "--deepspeed", "none"], nproc=2,
               launcher=f"accelerate:{REPO / 'recipes' / 'accelerate' / 'zero3_sp.yaml'}", script=SP_WORKER,
               timeout=600, cwd=tmp_path / "run")
    assert_same_training(tmp_path, one_process)
