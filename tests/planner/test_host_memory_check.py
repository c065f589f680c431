"""An offload preset whose model states alone exceed the node's memory is refused, with the planner's figure:
by hf-zero check --model and by ZeroCallback before the engine. Anything that fits passes."""

import json

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from hf_zero.cli import main
from hf_zero.config.presets import load_config
from hf_zero.planner import GIB, host_memory_problem, setup_of_config
from hf_zero.offload_fit import host_memory_problem_of

# Llama-3-8B's shapes with a 32k vocabulary: 7.24B parameters; zero2_offload keeps 134 GiB on the host (pinned
# master weights, their 16-bit copy and the fp32 gradients, each rounded up to a power of two, and Adam's moments)
EIGHT_B = dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, intermediate_size=14336, vocab_size=32000,
               num_attention_heads=32, num_key_value_heads=8)


def test_the_setup_names_follow_the_config():
    assert [setup_of_config(load_config(name)) for name in ("zero1", "zero2", "zero2_offload", "zero3",
                                                            "zero3_offload")] == \
        ["zero1", "zero2", "zero2_offload", "zero3", "zero3_offload"]
    assert setup_of_config(load_config("zero3_nvme", nvme_path="/tmp")) == "zero3_nvme"
    assert setup_of_config({"train_batch_size": 8}) is None


def test_states_over_the_node_memory_are_refused_and_under_it_pass():
    params = 7_241_732_096
    problem = host_memory_problem(load_config("zero2_offload"), params, params, 1, 1, 2, 64 * GIB)
    assert problem and "134.0 GiB of model states" in problem and "64.0 GiB" in problem and "Fix: zero3_nvme" in problem
    assert "136.0 GiB with its 1 process(es)" in problem
    assert host_memory_problem(load_config("zero2_offload"), params, params, 1, 1, 2, 160 * GIB) is None
    # the states fit, the process beside them does not
    assert host_memory_problem(load_config("zero2_offload"), params, params, 1, 1, 2, 135 * GIB)
    assert host_memory_problem(load_config("zero2_offload"), params, params, 1, 1, 2, 136 * GIB) is None
    # over 8 ranks on one node the node holds all of it; over 8 nodes of one rank each, an eighth
    assert host_memory_problem(load_config("zero3_offload"), params, params, 8, 8, 2, 120 * GIB)
    assert host_memory_problem(load_config("zero3_offload"), params, params, 8, 1, 2, 120 * GIB) is None
    assert host_memory_problem(load_config("zero2"), params, params, 1, 1, 2, 1) is None  # nothing on the host


def test_partial_offload_is_held_to_its_host_share():
    """offload_optimizer.ratio 0.3: DeepSpeed steps 30% of the sub-groups on the host, so a node that cannot hold the
    preset's states can hold these: the check follows the config, not the preset it started from."""
    params = 7_241_732_096
    partial = load_config("zero3_offload")
    partial["zero_optimization"]["offload_optimizer"]["ratio"] = 0.3
    # 7.24B in 8 sub-groups of 1e9: 5 step on the GPU; the host keeps 82 GiB of states, not the preset's 158
    assert host_memory_problem(load_config("zero3_offload"), params, params, 1, 1, 2, 128 * GIB)
    assert host_memory_problem(partial, params, params, 1, 1, 2, 128 * GIB) is None
    assert host_memory_problem(partial, params, params, 1, 1, 2, 16 * GIB)


def test_the_check_counts_deepspeeds_buffers_not_the_pinned_update_copy():
    """Without offload_param, ZeroCallback's pinned update buffers (2 bytes a host-stepped parameter) come only where
    the host has room for them: the check's floor is what DeepSpeed itself allocates."""
    from hf_zero.planner import PROCESS_HOST_BYTES, zero3_offload_host

    params = 7_241_732_096
    config = load_config("zero3_offload")
    del config["zero_optimization"]["offload_param"]
    alone = zero3_offload_host(params, params, 1, 2, params_on_host=False, pinned_update_copy=False)
    with_copy = zero3_offload_host(params, params, 1, 2, params_on_host=False)
    assert with_copy - alone >= 2 * params  # the buffers, each rounded up by torch's pinned cache
    assert host_memory_problem(config, params, params, 1, 1, 2, alone + PROCESS_HOST_BYTES) is None
    assert host_memory_problem(config, params, params, 1, 1, 2, alone + PROCESS_HOST_BYTES - GIB)


def test_check_cli_refuses_an_offload_preset_the_host_cannot_hold(tmp_path, capsys):
    model = tmp_path / "config.json"
    model.write_text(json.dumps(EIGHT_B))
    assert main(["check", "zero2_offload", "--model", str(model), "--host-mem", "64", "--no-env"]) == 1
    assert "error [host-memory]" in capsys.readouterr().out
    assert main(["check", "zero2_offload", "--model", str(model), "--host-mem", "512", "--no-env"]) == 0
    assert "host-memory" not in capsys.readouterr().out


def test_the_callbacks_check_uses_the_live_model():
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, vocab_size=97))

    assert "of model states in host memory" in host_memory_problem_of(load_config("zero2_offload"), model, 1, 2, 1024)
    assert host_memory_problem_of(load_config("zero2_offload"), model, 1, 2) is None  # this machine holds it


def test_a_host_memory_that_is_no_size_is_one_message(tmp_path, capsys):
    model = tmp_path / "config.json"
    model.write_text(json.dumps(EIGHT_B))
    assert main(["check", "zero2_offload", "--model", str(model), "--host-mem", "0", "--no-env"]) == 2
    assert "--host-mem must be a positive number of GiB" in capsys.readouterr().err


def test_offload_host_peaks_within_15_percent_of_the_h200():
    """One H200, 1.35B, micro batch 4, accumulation 16: peak RSS 35.42 GiB (23.38 pinned) for zero2_offload and
    34.34 GiB (17.25 pinned) for zero3_offload, about 2 GiB of it the process itself."""
    from transformers import LlamaConfig as Config

    from hf_zero.planner import ModelShape, RunShape, estimate

    model = ModelShape.from_config(Config(hidden_size=2048, num_hidden_layers=24, intermediate_size=5504,
                                          vocab_size=32000, num_attention_heads=16, num_key_value_heads=16))
    run = RunShape(seq=1024, micro_batch=4, accumulation=16, fp32_accumulation=False)
    assert estimate("zero2_offload", model, run).host_per_node / GIB == pytest.approx(35.42, rel=0.15)
    # the preset accumulating in fp32 (micro batch 32, accumulation 2 and 8): 32.09 GiB
    assert estimate("zero2_offload", model, RunShape(micro_batch=32, accumulation=8)).host_per_node / GIB \
        == pytest.approx(32.09, rel=0.15)
    assert estimate("zero3_offload", model, run).host_per_node / GIB == pytest.approx(34.34, rel=0.15)


def test_plan_takes_the_accumulation(capsys):
    def line(setup, accumulation):
        assert main(["plan", "1.35b", "--gpus", "1", "--gpu-mem", "140", "--micro-batch", "32",
                     "--gradient-accumulation-steps", str(accumulation)]) == 0
        return next(row.split() for row in capsys.readouterr().out.splitlines() if row.startswith(setup + " "))

    # accumulating, the gradients of the earlier micro-batches are alive through the later ones' backward: the plain
    # Trainer's fp32 gradients, zero2_offload's fp32 partition (5.0 GiB for 1.35B), which keeps the host at 32.0 GiB
    assert (line("ddp", 1)[2], line("ddp", 16)[2]) == ("0.0", "5.0")
    assert (line("zero2_offload", 1)[2], line("zero2_offload", 16)[2]) == ("0.0", "5.0")
    assert line("zero2_offload", 16)[8] == "32.0"
    assert main(["plan", "1.35b", "--gpus", "1", "--gradient-accumulation-steps", "0"]) == 2
    assert "--gradient-accumulation-steps must be at least 1" in capsys.readouterr().err


def test_an_nvme_parameter_partition_over_the_swap_buffer_is_refused_and_a_smaller_one_passes():
    from hf_zero.planner import nvme_buffer_problem

    config = load_config("zero3_nvme", nvme_path="/tmp")
    embedding = 32000 * 4096  # the 8B shape's embedding and LM head: 131,072,000 elements
    problem = nvme_buffer_problem(config, embedding, 1)
    assert problem and "buffer_size is 100,000,000" in problem and "Fix: set zero_optimization.offload_param" \
        ".buffer_size to at least 131,072,000" in problem
    assert nvme_buffer_problem(config, embedding, 2) is None  # 65,536,000 per rank
    assert nvme_buffer_problem(load_config("zero3_offload"), embedding, 1) is None  # no NVMe swapper
    bigger = {**config, "zero_optimization": {**config["zero_optimization"], "offload_param": {
        **config["zero_optimization"]["offload_param"], "buffer_size": 1.4e8}}}
    assert nvme_buffer_problem(bigger, embedding, 1) is None


def test_check_cli_names_the_nvme_buffer_for_a_large_vocabulary(tmp_path, capsys):
    model = tmp_path / "config.json"
    model.write_text(json.dumps(EIGHT_B))
    args = ["check", "zero3_nvme", "--nvme-path", str(tmp_path), "--model", str(model), "--host-mem", "512", "--no-env"]
    assert main(args) == 1
    assert "error [nvme-buffer-too-small]" in capsys.readouterr().out
    assert main([*args, "--world-size", "2"]) == 0
    assert "nvme-buffer" not in capsys.readouterr().out
