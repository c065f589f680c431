"""One check list behind both front doors: the Trainer's ZeroCallback and hf_zero.prepare in an Accelerate loop run
every check of hf_zero.checks, in the same order, and the checks the Accelerate door gained fire and stay quiet there
as they do for the Trainer."""

import pytest

from conftest import REPO, assert_same_losses, read_result, scenario_results
from hf_zero.checks import CHECKS
from hf_zero.compat.deepspeed_api import frozen_recompute_fails
from hf_zero.compat.hf_api import model_checkpointing_call

pytestmark = pytest.mark.multiproc
PREPARE_WORKER = REPO / "tests" / "workers" / "prepare_checks.py"
SHARDS_NOTHING = "on a single process shards nothing"
GPU_ONLY = "works only on GPUs"  # the presets' leaf-module threshold, dropped on CPU machines


def checks_in_order(ran) -> list:
    """(moment, id) of each check a run went through, once, in the order it first ran."""
    seen = []
    for moment, check_id, _ in ran:
        if [moment, check_id] not in seen:
            seen.append([moment, check_id])
    return seen


# every check at each of its moments that a door's run records (the arguments moment runs in TrainingArguments)
EVERY_CHECK = [[moment, c.id] for c in CHECKS for moment in c.moments if moment != "arguments"]


def test_the_trainer_door_runs_every_check_in_order(trained):
    result = read_result(trained("llama", "zero3", 2, "--gc", "--save-steps", "2"))
    assert checks_in_order(result["checks_ran"]) == EVERY_CHECK


def test_the_accelerate_door_runs_every_check_in_order(accelerate_zero3_loop):
    result = read_result(accelerate_zero3_loop)
    assert checks_in_order(result["checks_ran"]) == EVERY_CHECK


def test_the_list_is_checked_as_each_door_defines_it():
    ids = [c.id for c in CHECKS]
    assert len(ids) == len(set(ids))
    moments = [c.moments[-1] for c in CHECKS]
    assert moments == sorted(moments, key=["arguments", "config", "model", "engine", "save"].index)  # list order


@pytest.fixture(scope="module")
def prepare_checks(tiny_models, tmp_path_factory):
    return scenario_results(PREPARE_WORKER, tiny_models["llama"], tmp_path_factory.mktemp("prepare_checks"),
                            left_out=[SHARDS_NOTHING, GPU_ONLY])


def test_prepare_says_that_zero_on_one_process_shards_nothing(prepare_checks):
    [warning] = [w for w in prepare_checks.raw["zero2"]["warnings"] if SHARDS_NOTHING in w]
    assert "ZeRO-2 on a single process" in warning
    assert not any(SHARDS_NOTHING in w for w in prepare_checks.raw["host_memory_skipped"]["warnings"])  # offloaded


def test_prepare_passes_config_warnings_on(prepare_checks):
    assert prepare_checks("config_warning")["warnings"] == [
        "stage 2 ignores the stage-3 keys stage3_param_persistence_threshold. "
        "Fix: remove them, or set stage 3 if that was meant."]
    assert prepare_checks("zero2") == {"warnings": [], "error": None, "ran": prepare_checks("zero2")["ran"]}
    skipped = prepare_checks("config_warning_skipped")  # that finding alone, by its own id
    assert skipped["warnings"] == [] and skipped["error"] is None


def test_prepare_reports_a_zero3_model_built_whole(prepare_checks):
    [warning] = prepare_checks("built_whole")["warnings"]
    assert "built whole" in warning and "hf_zero.accelerator()" in warning
    assert not any("built whole" in w for w in prepare_checks("keep_adapters")["warnings"])


def test_prepare_casts_adapters_to_the_bf16_base_unless_told_not_to(prepare_checks):
    cast = prepare_checks("cast_adapters")
    [note] = cast["warnings"]
    assert note.startswith("cast 8 trainable fp32 tensors") and cast["adapter_dtypes"] == ["torch.bfloat16"]
    kept = prepare_checks("keep_adapters")
    assert kept["warnings"] == [] and kept["error"] is None and kept["adapter_dtypes"] == ["torch.float32"]


def test_prepare_stops_non_reentrant_lora_checkpointing_only_before_the_deepspeed_fix(prepare_checks):
    result = prepare_checks("lora_non_reentrant")
    if frozen_recompute_fails():  # the floor's DeepSpeed: refused before the engine exists
        assert "CheckpointError" in result["error"] and "checkpointing_enable(" in result["error"]
        return
    assert result["error"] is None
    [problem] = result["0.19.2"]
    assert model_checkpointing_call("{'use_reentrant': True}") in problem
    assert result["0.19.3"] == []
    quiet = prepare_checks("lora_reentrant")
    assert quiet["error"] is None and quiet["0.19.2"] == [] and quiet["0.19.3"] == []


def test_prepare_refuses_offload_the_host_cannot_hold_unless_skipped(prepare_checks):
    refused = prepare_checks("host_memory")
    assert "of model states in host memory" in refused["error"] and "[check host-memory]" in refused["error"]
    skipped = prepare_checks("host_memory_skipped")
    assert skipped["error"] is None and ["model", "host-memory", "skipped"] in skipped["ran"]


def test_prepare_refuses_another_optimizer_where_the_config_names_deepspeeds(prepare_checks):
    assert prepare_checks("optimizer_sgd")["error"] == (
        "the DeepSpeed config has an optimizer block (DeepSpeed's AdamW) and the loop passes SGD. Fix: pass "
        "accelerate.utils.DummyOptim(model.parameters(), lr=...), or remove the config's optimizer block to train with "
        "your own optimizer. [check optimizer-type]")
    skipped = prepare_checks("optimizer_sgd_skipped")  # hf_zero out of the way: what Accelerate says of it
    assert "optimizer-type" not in (skipped["error"] or "")


def test_quiet_about_the_optimizer_when_an_adamw_configures_deepspeeds(prepare_checks):
    quiet = prepare_checks("optimizer_adamw")
    assert quiet["error"] is None and ["model", "optimizer-type", "quiet"] in quiet["ran"]


def test_prepare_refuses_a_parameter_over_the_nvme_swap_buffer(prepare_checks):
    error = prepare_checks("nvme_buffer_small")["error"]
    assert "buffer_size is 4,096 elements" in error and error.endswith("[check nvme-buffer-too-small]")
    assert ["model", "nvme-buffer-too-small", "quiet"] in prepare_checks("zero2")["ran"]


def test_a_leaf_that_returns_a_model_output_stops_the_run_at_its_first_forward(prepare_checks):
    # the user made the inner base model (LlamaModel, which returns BaseModelOutputWithPast) a ZeRO-3 leaf: DeepSpeed
    # would never reduce its gradients (on CPU the step then fails in zero_grad, on a GPU nothing is said)
    result = prepare_checks("leaf_model")
    assert "module model (LlamaModel) is a ZeRO-3 leaf and returns BaseModelOutputWithPast" in result["error"]
    assert result["error"].endswith("[check leaf-outputs]") and "losses" not in result


def test_a_granularity_threshold_leaves_the_fast_leaf_path_for_the_ordinary_release(prepare_checks):
    # any threshold above 0 puts DeepSpeed's leaves on a path that frees their weights without waiting for the GPU
    # (two ranks on one H200 trained differently from DDP with it): prepare switches it off and says so
    found = prepare_checks("leaf_layers_threshold")
    assert found["error"] is None and found["fast_leaf_path"] is False
    assert ["engine", "leaf-release", "fired"] in found["ran"]
    assert_same_losses(found["losses"], prepare_checks("no_leaves")["losses"], "leaves with a threshold, no leaves")


def test_leaves_without_a_threshold_keep_deepspeeds_ordinary_release(prepare_checks):
    found = prepare_checks("leaf_layers")
    assert found["fast_leaf_path"] is False and ["engine", "leaf-release", "quiet"] in found["ran"]


def test_prepare_makes_the_decoder_layers_leaves_by_default(prepare_checks):
    found, off = prepare_checks("default_leaves"), prepare_checks("no_leaves")
    assert found["error"] is None and found["leaves"] == ["LlamaDecoderLayer"] * 2
    assert ["model", "block-leaves", "fired"] in found["ran"] and ["model", "block-leaves", "quiet"] in off["ran"]
    assert_same_losses(found["losses"], off["losses"], "default leaves, leaves off")


def test_lora_with_decoder_layer_leaves_trains_as_lora_without_leaves(prepare_checks):
    # the first layer's input is the frozen embedding's output: DeepSpeed would reduce that leaf's gradients before
    # its backward and stop there (RuntimeError: The size of tensor a (0) must match ...); leaf-inputs gives it one
    leaves, plain = prepare_checks("lora_leaf_layers"), prepare_checks("lora_no_leaves")
    assert leaves["error"] is None and ["engine", "leaf-inputs", "fired"] in leaves["ran"], leaves
    assert ["engine", "leaf-inputs", "quiet"] in plain["ran"]
    assert_same_losses(leaves["losses"], plain["losses"], "LoRA with leaves, LoRA without")
    assert leaves["losses"][2] < leaves["losses"][0]


def test_leaves_that_return_tensors_train_as_the_model_without_leaves(prepare_checks):
    # decoder layers return a tensor: the guard stays quiet and the leaves train as no leaves do (to rounding: one
    # gather per layer and one per module sum in another order)
    layers, plain = prepare_checks("leaf_layers"), prepare_checks("no_leaves")
    assert layers["error"] is None and plain["error"] is None
    assert ["engine", "leaf-outputs", "ran"] in layers["ran"]
    assert_same_losses(layers["losses"], plain["losses"], "leaves, no leaves")
    assert layers["losses"][2] < layers["losses"][0]
