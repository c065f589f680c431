"""hf-zero plan --largest and --nvme-mem: the deepest model of a shape that each setup fits, the resource that stops
it, zero3_nvme's host buffers and NVMe files as DeepSpeed 0.19.8 allocates them, and the configs it writes."""

import json
from pathlib import Path

import pytest
from transformers import AutoConfig

from hf_zero.model_configs import MODELS, build_config, resolve_model
from hf_zero.cli import main
from hf_zero.planner import (GIB, PROCESS_HOST_BYTES, ModelShape, RunShape, estimate, largest_model, run_of_config,
                             shortfall, zero3_nvme_host)

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "zero3_nvme.json"
RUN = RunShape(seq=1024, gradient_checkpointing=True)


@pytest.fixture(scope="module")
def llama_1b():
    return ModelShape.from_config(build_config({"model_type": "llama", **MODELS["1.35b"]}), name="1.35b")


def test_nvme_swap_settings_come_from_the_config(llama_1b):
    """zero3_nvme's swap buffers are its JSON's keys: the preset's as shipped, and more host memory for more buffers."""
    config = json.loads(RECIPE.read_text())
    zero = config["zero_optimization"]
    swap = run_of_config(RunShape(), config).nvme_swap
    assert (swap.param_buffers, swap.param_buffer_size, swap.max_in_cpu, swap.optimizer_buffers) == (
        zero["offload_param"]["buffer_count"], zero["offload_param"]["buffer_size"], zero["offload_param"]["max_in_cpu"],
        zero["offload_optimizer"]["buffer_count"])
    zero["offload_param"]["buffer_count"] += 2  # two more 16-bit buffers of buffer_size elements, page-locked
    more = estimate("zero3_nvme", llama_1b, run_of_config(RunShape(), config)).host_per_node
    assert more - estimate("zero3_nvme", llama_1b, RunShape()).host_per_node == 2 * zero["offload_param"]["buffer_size"] * 2


def test_zero3_nvme_counts_deepspeeds_swap_buffers_and_files(llama_1b):
    """1.35B on one rank, bf16: each host buffer DeepSpeed 0.19.8 allocates (see zero3_nvme_host) and the swap
    files: 16-bit parameters, fp32 master weights, Adam's two moments and fp32 gradients."""
    psi, sub_group = llama_1b.params, 1_000_000_000
    host = (4 * GIB  # the 16-bit flat gradient partition (2.69e9 bytes), rounded up by torch's pinned cache
            + 2 * GIB  # max_in_cpu 16-bit parameters (2e9 bytes), rounded up
            + 5 * 100_000_000 * 2  # the parameter swapper's buffers, page-locked at their size
            + 4 * sub_group * 4  # the optimizer swapper's fp32 buffers of the largest sub-group
            + 2 * sub_group  # the 16-bit write-back buffer (the partition is over max_in_cpu)
            + 4 * sub_group  # the pageable fp32 gradient buffer the swapped sub-groups' .grad views
            + PROCESS_HOST_BYTES)  # the process itself
    planned = estimate("zero3_nvme", llama_1b, RunShape())
    assert planned.host_per_node == host  # 29.4 GiB
    assert planned.nvme_per_node == 18 * psi
    # on 8 ranks of one node: each rank's partition (168M) is under max_in_cpu and under a sub-group
    partition = psi // 8
    assert zero3_nvme_host(psi, 8, 2) == (2 * (1 << (2 * partition - 1).bit_length()) + 5 * 100_000_000 * 2
                                          + 4 * partition * 4 + 4 * partition)


def test_nvme_capacity_refuses_what_the_disk_cannot_hold(llama_1b):
    planned = estimate("zero3_nvme", llama_1b, RUN)  # 22.6 GiB of swap files
    assert shortfall(planned, 140 * GIB, None) is None  # no --nvme-mem: the disk is not limited
    assert shortfall(planned, 140 * GIB, None, nvme_capacity=64 * GIB) is None
    short = shortfall(planned, 140 * GIB, None, nvme_capacity=20 * GIB)
    assert short == "needs 22.6 GiB of NVMe per node for DeepSpeed's swap files, over 90% of 20 GiB"


def test_with_layers_is_the_model_built_with_that_many_layers(llama_1b):
    for layers in (1, 5, 40):
        built = ModelShape.from_config(build_config({"model_type": "llama", **MODELS["1.35b"],
                                                     "num_hidden_layers": layers}))
        assert llama_1b.with_layers(layers).params == built.params and llama_1b.with_layers(layers).layers == layers


def _fits(setup, model, layers, gpu, host, nvme):
    return shortfall(estimate(setup, model.with_layers(layers), RUN), gpu, host, nvme_capacity=nvme) is None


@pytest.mark.parametrize("setup, gpu_gib, cpu_gib, nvme_gib, limit", [
    ("ddp", 80, None, None, ("GPU",)),
    ("zero3", 80, 64, 64, ("GPU",)),
    ("zero3_offload", 140, 64, None, ("host",)),
    ("zero3_nvme", 140, 512, 100, ("NVMe",)),
    ("zero3_nvme", 140, 32, 1024, ("host",)),
])
def test_the_largest_model_is_the_deepest_that_fits_and_names_its_limit(llama_1b, setup, gpu_gib, cpu_gib, nvme_gib,
                                                                        limit):
    gpu, host, nvme = gpu_gib * GIB, cpu_gib and cpu_gib * GIB, nvme_gib and nvme_gib * GIB
    found = largest_model(setup, llama_1b, RUN, gpu, host, nvme)
    layers = found.model.layers
    assert [_fits(setup, llama_1b, n, gpu, host, nvme) for n in (layers, layers + 1)] == [True, False]
    assert found.limit == limit
    assert found.model.hidden == llama_1b.hidden and found.model.vocab == llama_1b.vocab
    assert found.estimate.gpu_total == estimate(setup, found.model, RUN).gpu_total


def test_without_host_or_nvme_capacity_only_the_gpu_limits(llama_1b):
    """No --cpu-mem and no --nvme-mem: the offload presets are stopped by the GPU or by the search's bound, never
    by host memory or NVMe, however much of them the model would need."""
    for setup in ("zero2_offload", "zero3_offload", "zero3_nvme"):
        found = largest_model(setup, llama_1b, RUN, 140 * GIB, None, None)
        assert found.limit in ((), ("GPU",)), setup
        assert "host" not in found.limit and "NVMe" not in found.limit
    bounded = largest_model("zero3_nvme", llama_1b, RUN, 140 * GIB, None, None, max_layers=100)
    assert bounded.model.layers == 100 and bounded.limit == ()


def test_none_fits_names_the_first_layers_limit(llama_1b):
    found = largest_model("ddp", llama_1b, RUN, 2 * GIB, None)  # the embedding and LM head alone are over
    assert found.model is None and found.limit == ("GPU",)


def test_plan_cli_prints_and_writes_the_largest_models(tmp_path, capsys):
    out = tmp_path / "largest"
    assert main(["plan", "1.35b", "--gpus", "1", "--gpu-mem", "80", "--cpu-mem", "64", "--nvme-mem", "40",
                 "--gradient-checkpointing", "--largest", "--json", "--largest-configs", str(out)]) == 0
    largest = json.loads(capsys.readouterr().out)["largest"]
    assert {setup: found["limit"] for setup, found in largest.items()} == {
        "ddp": ["GPU"], "zero1": ["GPU"], "zero2": ["GPU"], "zero2_offload": ["host"], "zero3": ["GPU"],
        "zero3_offload": ["host"], "zero3_nvme": ["NVMe"]}
    for setup, found in largest.items():
        path = out / setup / "config.json"
        loaded = AutoConfig.from_pretrained(path.parent)
        assert loaded.num_hidden_layers == found["layers"] and loaded.hidden_size == 2048
        name, config = resolve_model(str(path))  # what the benchmark harness --model reads
        assert name == setup and ModelShape.from_config(build_config(config)).params == found["params"]


def test_plan_cli_table_says_which_resource_stops_each_setup(capsys):
    assert main(["plan", "1.35b", "--gpus", "1", "--gpu-mem", "2", "--gradient-checkpointing", "--largest"]) == 1
    out = capsys.readouterr().out
    assert "Largest model of 1.35b's shape (hidden 2048, intermediate 5504, 16 heads, vocab 32000" in out
    assert "NVMe is not limited without --nvme-mem" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.split("limit\n", 1)[1].splitlines()[:7]}
    assert rows["ddp"] == ["none", "fits", "GPU"]
    nvme = next(line for line in out.splitlines() if line.startswith("zero3_nvme") and line.endswith("GPU"))
    assert nvme.split()[1].isdigit()


@pytest.mark.parametrize("flags, message", [
    (["--nvme-mem", "-5"], "--nvme-mem must be a positive number of GiB, got -5"),
    (["--nvme-mem", "0"], "--nvme-mem must be a positive number of GiB, got 0"),
    (["--nvme-mem", "nan"], "--nvme-mem must be a positive number of GiB"),
    (["--nvme-mem", "lots"], "--nvme-mem: invalid float value: 'lots'"),
    (["--largest-configs", "{tmp}/out"], "--largest-configs writes the models that --largest finds; add --largest"),
    (["--largest", "--largest-configs", "{tmp}/file/out"], "--largest-configs: cannot create the folder"),
])
def test_plan_refuses_bad_largest_and_nvme_flags(tmp_path, capsys, flags, message):
    (tmp_path / "file").write_text("not a folder")
    argv = ["plan", "tiny", "--gpus", "1", "--gpu-mem", "80", *[f.replace("{tmp}", str(tmp_path)) for f in flags]]
    code = _exit_code(argv)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err and err.count("error:") == 1
    assert not (tmp_path / "out").exists()


def _exit_code(argv) -> int:
    """main's exit code; argparse's own refusals (a value of the wrong type) raise SystemExit with it."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_a_zero3_nvme_run_whose_swap_buffers_overflow_the_host_is_refused(tmp_path, llama_1b):
    from hf_zero.config.presets import load_config
    from hf_zero.planner import host_memory_problem

    config = load_config("zero3_nvme", nvme_path=str(tmp_path))
    psi = llama_1b.params
    problem = host_memory_problem(config, psi, psi, 1, 1, 2, 16 * GIB)
    assert problem.startswith("zero3_nvme keeps 27.4 GiB") and "pinned NVMe swap buffers" in problem
    assert "Fix: more nodes, or a smaller model" in problem and "Fix: zero3_nvme" not in problem
    assert host_memory_problem(config, psi, psi, 1, 1, 2, 32 * GIB) is None
