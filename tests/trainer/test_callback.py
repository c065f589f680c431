"""Each ZeroCallback check, in a real DeepSpeed run: one case where it fires, one where it stays quiet."""

import json
import os

import pytest

from conftest import assert_reload_bitwise, assert_same_losses, read_result, run_lora, run_worker, scenario_results
from hf_zero.compat.deepspeed_api import frozen_recompute_fails

pytestmark = pytest.mark.multiproc
cpu_only = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CPU-machine pitfall")


def _args(tiny_models, out, *extra, preset="zero3", model="llama"):
    return ["--model", tiny_models[model], "--out", out, "--deepspeed", preset, *extra]


@cpu_only
def test_fires_when_accelerate_use_cpu_swaps_deepspeed_for_ddp(tiny_models, tmp_path):
    proc = run_worker(_args(tiny_models, tmp_path, preset="zero1"), env={"ACCELERATE_USE_CPU": "true"}, expect_fail=True)
    assert "not a DeepSpeedEngine" in proc.stderr and "ACCELERATE_USE_CPU" in proc.stderr


def test_quiet_engine_check_on_a_real_engine(trained):
    result = read_result(trained("llama", "zero1", 2))
    assert result["engine"] == "DeepSpeedEngine" and result["warnings"] == []


# zero3 on one rank is a run make test has anyway (test_zero_training.py); zero1's runs in make test-long
@pytest.mark.parametrize("preset", [pytest.param("zero1", marks=pytest.mark.slow), "zero3"])
def test_warns_that_zero_on_one_process_shards_nothing(trained, preset):
    result = read_result(trained("llama", preset, 1))
    [warning] = result["warnings"]
    assert f"ZeRO-{preset[-1]} on a single process shards nothing" in warning and "offload preset" in warning


def test_quiet_about_one_process_when_states_are_offloaded(monkeypatch):
    from hf_zero.checks import RunContext
    from hf_zero.checks.catalog import single_process

    offload = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert single_process(RunContext("trainer", offload)) == []
    assert single_process(RunContext("trainer", {"zero_optimization": {"stage": 2}})) != []
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert single_process(RunContext("trainer", {"zero_optimization": {"stage": 2}})) == []


@cpu_only
@pytest.mark.requires("accelerate>=1.13.0")  # 1.12 starts gloo for such a launch: the ranks train together there
def test_fires_when_ranks_would_train_alone(tiny_models, tmp_path):
    # transformers' own TrainingArguments on CPU without use_cpu: each rank sees world size 1
    proc = run_worker(_args(tiny_models, tmp_path, "--plain-args", preset="zero2"), nproc=2, expect_fail=True)
    assert "the Trainer trains on a data-parallel world size of 1, but 2 processes were launched" in proc.stderr
    assert "use_cpu=True" in proc.stderr and "the DeepSpeed engine trains on" not in proc.stderr


def test_fires_when_the_engine_trains_on_another_world_size(tiny_models, tmp_path):
    # the Trainer's check passes at attach; then the launch claims 2 processes while the engine has 1 rank
    proc = run_worker(_args(tiny_models, tmp_path, "--world-size-after-attach", "2", preset="zero2"), expect_fail=True)
    assert "the DeepSpeed engine trains on a data-parallel world size of 1, but 2 processes were launched" in proc.stderr
    assert "the Trainer trains on" not in proc.stderr


def test_fires_when_stage3_is_configured_but_the_engine_did_not_partition(tiny_models, tmp_path):
    # the callback saw stage 3 at attach; the live config is changed to stage 2 before the engine is built from it
    proc = run_worker(_args(tiny_models, tmp_path, "--load", "whole", "--stage-after-attach", "2"), expect_fail=True)
    assert "stage 3 is configured but the parameters are not partitioned (zero.Init did not run)" in proc.stderr


def test_quiet_world_size_with_hf_zero_arguments(trained):
    result = read_result(trained("llama", "zero2", 2))
    assert result["dp_world_size"] == 2 and result["warnings"] == []


def test_warns_when_zero3_model_was_built_whole(tiny_models, tmp_path):
    run_worker(_args(tiny_models, tmp_path, "--load", "whole"), nproc=2)
    result = read_result(tmp_path)
    assert result["partitioned_at_load"] is False
    [warning] = [w for w in result["warnings"] if "built whole" in w]
    assert "GiB of host memory" in warning and "hf_zero.from_pretrained" in warning
    assert_reload_bitwise(tmp_path)


def test_quiet_when_zero3_model_loaded_partitioned(trained):
    result = read_result(trained("llama", "zero3", 2))
    assert result["partitioned_at_load"] is True
    assert not any("built whole" in w for w in result["warnings"])
    # it trained past on_train_begin's engine checks, so they stayed quiet too
    assert result["steps_trained"] == [1, 2, 3, 4] and result["engine"] == "DeepSpeedEngine"


def test_quiet_about_gathering_when_the_config_already_gathers(trained):
    result = read_result(trained("llama", "zero3", 2))
    assert not any("stage3_gather_16bit_weights_on_model_save" in w for w in result["warnings"]), result["warnings"]


def test_gather_off_is_turned_on_so_the_save_reloads(tiny_models, tmp_path):
    import hf_zero

    config = hf_zero.load_config("zero3")
    config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = False
    path = tmp_path / "gather_off.json"
    path.write_text(json.dumps(config))
    run_worker(_args(tiny_models, tmp_path, preset=str(path)), nproc=2)
    result = read_result(tmp_path)
    assert any("stage3_gather_16bit_weights_on_model_save was off" in w for w in result["warnings"])
    assert (tmp_path / "final" / "model.safetensors").exists()
    assert_reload_bitwise(tmp_path)


def test_checkpoint_folders_verified_and_reloadable(trained):
    out = trained("llama", "zero3", 2, "--gc", "--save-steps", "2")
    from hf_zero import saved_model_problems

    assert saved_model_problems(out / "checkpoint-2") == []
    assert saved_model_problems(out / "checkpoint-4") == []
    # the last checkpoint (step 4 of 4) holds the engine's final weights: it reloads to exactly them
    assert_reload_bitwise(out, folder="checkpoint-4")


def test_incomplete_checkpoint_fails_the_save_and_the_older_one_survives_rotation(tiny_models, tmp_path):
    """The shard is cut after DeepSpeed wrote it and the Trainer goes on: it writes trainer_state.json and would
    rotate checkpoint-2 away (save_total_limit 1) before anything checked checkpoint-4. hf_zero rotates in on_save,
    only after the check, which fails here."""
    from hf_zero import checkpoint_problems

    proc = run_worker(_args(tiny_models, tmp_path, "--save-steps", "2", "--save-total-limit", "1", "--corrupt-save", "4",
                            preset="zero2"), expect_fail=True)
    assert ("hf_zero: checkpoint is incomplete or will not reload (older checkpoints were kept): global_step4: "
            "zero_pp_rank_0_mp_rank_00_optim_states.pt is truncated or corrupt") in proc.stderr
    assert (tmp_path / "checkpoint-4" / "trainer_state.json").exists()  # the Trainer's save itself finished
    assert (tmp_path / "checkpoint-2").is_dir(), "rotated away before checkpoint-4 was verified"
    assert checkpoint_problems(tmp_path / "checkpoint-2") == []


@pytest.mark.slow  # compiling takes ~35 s here
@pytest.mark.skipif(os.environ.get("ATEN_CPU_CAPABILITY") == "default",
                    reason="torch's inductor writes CPU kernels that do not build under ATEN_CPU_CAPABILITY=default "
                           "(error: 'at::vec' has not been declared)")
def test_zero3_torch_compile_compiles_blocks_and_leaves_hooks_eager(trained, tiny_models, tmp_path):
    # Accelerate would compile DeepSpeed's fetch/release hooks with the model, and dynamo recompiles per layer.
    # Persistence 0: the tiny model's weights are partitions, gathered by the hooks around each compiled block.
    import hf_zero

    config = hf_zero.load_config("zero3")
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    (tmp_path / "z3.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    run_worker(_args(tiny_models, out, "--torch-compile", preset=str(tmp_path / "z3.json")), nproc=2)
    result, eager = read_result(out), read_result(trained("llama", "zero3", 2))
    assert result["compiled_block_forwards"] == 2  # the tiny Llama's two decoder layers
    assert any("compiled the forward of 2 repeated blocks" in w for w in result["warnings"])
    assert result["linear_is_torch"]  # zero.Init's memory-efficient linear is undone
    assert result["dynamo_graphs"] == 1  # one graph serves both layers: nothing specialized on ds_id
    # compiled kernels fuse and reorder what eager ones compute: a wider tolerance than two eager paths get
    assert_same_losses(result["losses"], eager["losses"], "compiled blocks, eager", rel=1e-3)
    assert_reload_bitwise(out)


@pytest.mark.slow  # compiles (~40 s)
def test_zero3_torch_compile_with_frozen_weights_is_left_to_accelerate(tiny_models, tmp_path):
    # LoRA: DeepSpeed 0.19.8 loses a leaf module's frozen weights before their backward, so no leaves
    result = run_lora(tiny_models["llama"], tmp_path, env={"ACCELERATE_DYNAMO_BACKEND": "inductor"})
    [note] = [w for w in result["warnings"] if "torch_compile" in w]
    assert "frozen parameters" in note and "left to Accelerate" in note


def test_quiet_compile_without_torch_compile(trained):
    eager = read_result(trained("llama", "zero3", 2))
    assert eager["compiled_block_forwards"] == 0 and not eager["linear_is_torch"] and eager["dynamo_graphs"] == 0
    assert not any("torch_compile" in w for w in eager["warnings"])


@pytest.mark.slow
def test_quiet_compile_below_stage3(trained):
    zero2 = read_result(trained("llama", "zero2", 2, "--torch-compile"))  # no parameter hooks: Accelerate compiles
    assert zero2["compiled_block_forwards"] == 0 and zero2["dynamo_graphs"] >= 1


def test_compile_finds_the_outermost_repeated_blocks_only():
    import torch

    from hf_zero.zero3.compile import repeated_blocks

    class Block(torch.nn.Module):  # an MoE-like block: its experts are a repeated list too
        def __init__(self):
            super().__init__()
            self.experts = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])

    model = torch.nn.Sequential(torch.nn.Embedding(4, 2), torch.nn.ModuleList([Block() for _ in range(4)]))
    assert [type(b) for b in repeated_blocks(model)] == [Block] * 4
    assert repeated_blocks(torch.nn.Linear(2, 2)) == []


# ---- attach-time checks, one process, no engine (tests/workers/attach_checks.py, ~6 s for all) ----------

ATTACH_WORKER = __import__("conftest").REPO / "tests" / "workers" / "attach_checks.py"
SHARDS_NOTHING = "on a single process shards nothing"  # said in every 1-process ZeRO run; not what these test


@pytest.fixture(scope="module")
def attach_checks(tiny_models, tmp_path_factory):
    # peft is in the test extra: the worker imports it, and fails (not skips) without it
    return scenario_results(ATTACH_WORKER, tiny_models["llama"], tmp_path_factory.mktemp("attach_checks"),
                            left_out=[SHARDS_NOTHING], timeout=300)


GPU_ONLY_NOTE = "stage3_module_granularity_threshold set to 0: DeepSpeed's leaf-module fast path works only on GPUs"


@cpu_only
def test_gpu_only_setting_dropped_on_cpu_is_said(attach_checks):
    # transformers' own TrainingArguments keep a config's leaf-module threshold; the callback drops it on CPU
    result = attach_checks("gpu_only_dropped")
    assert result["warnings"] == [GPU_ONLY_NOTE] and result["leaf_threshold"] == 0


def test_quiet_about_gpu_only_settings_when_the_config_has_none(attach_checks):
    assert attach_checks("gpu_only_absent") == {"warnings": [], "error": None}


def test_config_warnings_are_passed_on(attach_checks):
    assert attach_checks("finding_warning")["warnings"] == [
        "stage 2 ignores the stage-3 keys stage3_param_persistence_threshold. "
        "Fix: remove them, or set stage 3 if that was meant."]


def test_quiet_config_warnings_on_a_sound_config(attach_checks):
    assert attach_checks("finding_none") == {"warnings": [], "error": None}


def test_one_config_finding_is_skipped_by_its_own_id(attach_checks):
    assert attach_checks("finding_warning_skipped") == {"warnings": [], "error": None}


@pytest.mark.parametrize("name, use_reentrant", [("reentrant_zero3", True), ("reentrant_zero2", True),
                                                   ("non_reentrant_zero3", False)])
def test_quiet_about_the_users_choice_of_reentrant_checkpointing_and_keeps_it(attach_checks, name, use_reentrant):
    # DeepSpeed 0.19.8 trains ZeRO-3 to the same bits either way (tests/multiproc/test_reentrant_checkpointing.py)
    assert attach_checks(name) == {"warnings": [], "error": None, "use_reentrant": use_reentrant}


def test_checkpointing_without_kwargs_is_non_reentrant(attach_checks):
    assert attach_checks("default_checkpointing_zero3") == {"warnings": [], "error": None, "use_reentrant": False}


def test_gather_off_refused_when_not_forced_on(attach_checks):
    result = attach_checks("no_force_gather_off")
    assert result["error"].startswith("stage 3 with stage3_gather_16bit_weights_on_model_save off: every saved model "
                                      "would be ZeRO shards")


def test_quiet_gather_not_forced_but_already_on(attach_checks):
    assert attach_checks("no_force_gather_on") == {"warnings": [], "error": None}


def test_adapters_cast_to_the_bf16_base_by_default(attach_checks):
    result = attach_checks("cast_adapters")
    [note] = result["warnings"]
    assert note.startswith("cast 8 trainable fp32 tensors") and "to torch.bfloat16" in note
    assert result["adapter_dtypes"] == ["torch.bfloat16"]


def test_quiet_adapters_kept_fp32_with_cast_adapters_false(attach_checks):
    result = attach_checks("keep_adapters")
    assert result["warnings"] == [] and result["error"] is None and result["adapter_dtypes"] == ["torch.float32"]


def test_non_reentrant_checkpointing_of_lora_is_stopped_only_before_the_deepspeed_fix(attach_checks):
    # A DeepSpeed >= 0.19.3 attaches without an error; judged as 0.19.2 (CheckpointError there) the same args and
    # PeftModel are refused, with the fix in the message. The installed DeepSpeed is judged as what it is: the floor
    # environment's 0.18.0 has the bug, and attaching there is refused.
    result = attach_checks("lora_reentrant_False_zero3")
    if frozen_recompute_fails():
        assert "CheckpointError" in result["error"] and "'use_reentrant': True" in result["error"]
        return  # refused at attach: the worker judges nothing more
    assert result["error"] is None
    [problem] = result["0.19.2"]
    assert "CheckpointError" in problem and "deepspeed>=0.19.3" in problem and "'use_reentrant': True" in problem
    assert result["0.19.3"] == []


@pytest.mark.parametrize("name", ["lora_reentrant_True_zero3", "full_non_reentrant_zero3"])
def test_quiet_about_recompute_with_reentrant_lora_or_full_fine_tuning(attach_checks, name):
    result = attach_checks(name)
    assert result["error"] is None and result["0.19.2"] == [] and result["0.19.3"] == []


def test_lora_checkpointing_without_kwargs_is_reentrant_only_where_non_reentrant_fails(attach_checks):
    # a DeepSpeed with the recompute fix: non-reentrant; one without it: reentrant (not a refusal of its own pick),
    # on the installed DeepSpeed as on one judged as 0.19.2
    result = attach_checks("lora_default_checkpointing_zero3")
    assert result["error"] is None and result["warnings"] == []
    assert result["use_reentrant"] is frozen_recompute_fails() and result["0.19.2"] == {"use_reentrant": True}


def test_offload_the_host_cannot_hold_is_refused_unless_the_check_is_skipped(attach_checks):
    refused = attach_checks("host_memory")
    assert "of model states in host memory" in refused["error"] and "[check host-memory]" in refused["error"]
    skipped = attach_checks("host_memory_skipped")
    assert skipped["error"] is None and skipped["skipped"] == [["model", "host-memory", "skipped"]]


ALL_PARTS = {"tiled_mlp": True, "fused_loss": True, "offload_activations": True}
CHECKPOINTING_ON = ("long_context turned gradient checkpointing on: offload_activations moves the checkpointed layer "
                    "inputs to host memory.")


def test_long_context_refuses_a_model_that_cannot_run_a_part_at_attach(attach_checks):
    for name in ("long_context_eager", "long_context_eager_without_deepspeed"):
        error = attach_checks(name)["error"]
        assert error.startswith("long_context: attn_implementation 'eager' builds seq x seq attention scores") and \
            error.endswith("[check long-context]"), name


def test_long_context_puts_its_parts_on_a_model_that_can_run_them(attach_checks):
    for name in ("long_context_on", "long_context_without_deepspeed"):
        assert attach_checks(name) == {"warnings": [CHECKPOINTING_ON], "error": None, "long_context": ALL_PARTS,
                                       "checkpointing": True}, name


def test_long_context_refusal_skipped_by_its_id_still_puts_the_parts_on(attach_checks):
    assert attach_checks("long_context_eager_skipped") == {"warnings": [CHECKPOINTING_ON], "error": None,
                                                           "long_context": ALL_PARTS, "checkpointing": True}


def test_a_parameter_over_the_nvme_swap_buffer_is_refused_before_the_engine_unless_skipped(attach_checks):
    error = attach_checks("nvme_buffer_small")["error"]
    assert "buffer_size is 4,096 elements, and this model's largest parameter (16,384 elements)" in error
    assert error.endswith("[check nvme-buffer-too-small]")
    assert attach_checks("nvme_buffer_small_skipped")["error"] is None


def test_quiet_about_the_nvme_buffer_with_the_presets(attach_checks):
    assert attach_checks("nvme_buffer_preset")["error"] is None


def test_an_id_skipped_on_the_arguments_stays_skipped_in_the_callback(attach_checks):
    assert attach_checks("arguments_skip_kept") == {"warnings": [], "error": None}
