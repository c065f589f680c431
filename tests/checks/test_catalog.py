"""hf_zero.checks' list: every check keeps a test where it fires and one where it stays quiet (named here, found in
the test files), the docs list every check, and the options that turn checks off are checked themselves."""

import ast
import re

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import REPO
from hf_zero.checks import CHECK_IDS, CHECKS, SKIP_IDS, RunContext, check_options, run_moment
from hf_zero.checks.catalog import (cache_off_while_checkpointing, generation_in_step, model_leaves,
                                    sequence_parallel_loss)
from hf_zero.compat.hf_api import enable_model_checkpointing
from hf_zero.config.findings import FINDING_CODES
from hf_zero.errors import ConfigError

# check id -> (tests where it fires, tests where it stays quiet), as file::function
COVERAGE = {
    "fp16-arguments-on-cpu": (["config/test_validation.py::test_fp16_on_cpu_refused_by_training_args",
                               "trainer/test_launch_checks.py::test_fp16_arguments_on_cpu"],
                              ["trainer/test_launch_checks.py::test_fp16_arguments_on_cpu"]),
    "world-size": (["trainer/test_callback.py::test_fires_when_ranks_would_train_alone",
                    "multiproc/test_accelerate_loop.py::test_a_plain_accelerator_on_cpu_is_stopped_before_ranks_train_alone"],
                   ["trainer/test_callback.py::test_quiet_world_size_with_hf_zero_arguments"]),
    "gpu-only-settings": (["trainer/test_callback.py::test_gpu_only_setting_dropped_on_cpu_is_said"],
                          ["trainer/test_callback.py::test_quiet_about_gpu_only_settings_when_the_config_has_none"]),
    "deepspeed-config": (["trainer/test_callback.py::test_config_warnings_are_passed_on",
                          "checks/test_doors.py::test_prepare_passes_config_warnings_on",
                          "trainer/test_launch_checks.py::test_the_config_linter_on_the_arguments"],
                         ["trainer/test_callback.py::test_quiet_config_warnings_on_a_sound_config"]),
    "save-gathers-weights": (["trainer/test_callback.py::test_gather_off_is_turned_on_so_the_save_reloads",
                              "trainer/test_callback.py::test_gather_off_refused_when_not_forced_on"],
                             ["trainer/test_callback.py::test_quiet_about_gathering_when_the_config_already_gathers",
                              "trainer/test_callback.py::test_quiet_gather_not_forced_but_already_on"]),
    "long-context": (["trainer/test_callback.py::test_long_context_refuses_a_model_that_cannot_run_a_part_at_attach"],
                     ["trainer/test_callback.py::test_long_context_puts_its_parts_on_a_model_that_can_run_them"]),
    "long-context-parts": (["trainer/test_callback.py::test_long_context_puts_its_parts_on_a_model_that_can_run_them",
                            "trainer/test_callback.py::test_long_context_refusal_skipped_by_its_id_still_puts_the_parts_on"],
                           ["trainer/test_callback.py::test_quiet_config_warnings_on_a_sound_config"]),
    "optimizer-type": (["checks/test_doors.py::test_prepare_refuses_another_optimizer_where_the_config_names_deepspeeds"],
                       ["checks/test_doors.py::test_quiet_about_the_optimizer_when_an_adamw_configures_deepspeeds"]),
    "parallel-layout": (["config/test_parallel_layout.py::test_layouts_that_do_not_divide_are_refused_before_the_engine",
                         "config/test_sequence_parallel_checks.py::test_world_not_divisible_by_sp_size"],
                        ["config/test_sequence_parallel_checks.py::test_all_sp_checks_together_and_none_without_sp"]),
    "sequence-parallel-batches": (["config/test_sequence_parallel_checks.py::test_batch_width_not_divisible_by_sp_size"],
                                  ["config/test_sequence_parallel_checks.py::"
                                   "test_batches_without_position_ids_get_the_models_default"]),
    "host-memory": (["trainer/test_callback.py::test_offload_the_host_cannot_hold_is_refused_unless_the_check_is_skipped",
                     "checks/test_doors.py::test_prepare_refuses_offload_the_host_cannot_hold_unless_skipped"],
                    ["planner/test_host_memory_check.py::test_states_over_the_node_memory_are_refused_and_under_it_pass"]),
    "nvme-buffer-too-small": (["trainer/test_callback.py::"
                               "test_a_parameter_over_the_nvme_swap_buffer_is_refused_before_the_engine_unless_skipped",
                               "checks/test_doors.py::test_prepare_refuses_a_parameter_over_the_nvme_swap_buffer",
                               "planner/test_host_memory_check.py::test_check_cli_names_the_nvme_buffer_for_a_large_vocabulary"],
                              ["trainer/test_callback.py::test_quiet_about_the_nvme_buffer_with_the_presets",
                               "planner/test_host_memory_check.py::test_check_cli_names_the_nvme_buffer_for_a_large_vocabulary"]),
    "offload-threads": (["trainer/test_offload_overflow.py::test_offload_threads_fire_with_one_thread_of_eight_cores"],
                        ["trainer/test_offload_overflow.py::test_quiet_offload_threads"]),
    "single-process": (["trainer/test_callback.py::test_warns_that_zero_on_one_process_shards_nothing",
                        "checks/test_doors.py::test_prepare_says_that_zero_on_one_process_shards_nothing"],
                       ["trainer/test_callback.py::test_quiet_about_one_process_when_states_are_offloaded"]),
    "frozen-weights-leaves": (["trainer/test_lora.py::test_frozen_weights_turn_off_deepspeeds_leaf_modules"],
                              ["trainer/test_lora.py::test_frozen_weights_turn_off_deepspeeds_leaf_modules"]),
    "model-leaves": (["checks/test_catalog.py::test_a_threshold_that_makes_the_whole_model_one_leaf_keeps_its_layers",
                      "checks/test_catalog.py::test_a_threshold_that_makes_a_vision_tower_a_leaf_keeps_the_other_leaves"],
                     ["checks/test_catalog.py::test_a_threshold_that_makes_decoder_layers_leaves_is_kept",
                      "checks/test_catalog.py::test_a_threshold_that_makes_a_vision_tower_a_leaf_keeps_the_other_leaves"]),
    "adapter-dtype": (["trainer/test_callback.py::test_adapters_cast_to_the_bf16_base_by_default",
                       "checks/test_doors.py::test_prepare_casts_adapters_to_the_bf16_base_unless_told_not_to"],
                      ["trainer/test_callback.py::test_quiet_adapters_kept_fp32_with_cast_adapters_false"]),
    "lora-fits-zero2": (["trainer/test_lora.py::test_zero2_advice_for_a_lora_base_that_fits_each_gpu"],
                        ["trainer/test_lora.py::test_no_zero2_advice_in_cpu_lora_runs"]),
    "compile-blocks": (["trainer/test_callback.py::test_zero3_torch_compile_compiles_blocks_and_leaves_hooks_eager"],
                       ["trainer/test_callback.py::test_quiet_compile_without_torch_compile"]),
    "block-leaves": (["zero3/test_block_leaves.py::test_the_decoder_layers_become_leaves_and_the_note_names_them",
                      "zero3/test_block_leaves.py::test_named_classes_become_leaves_and_an_unknown_one_is_refused_naming_the_blocks"],
                     ["zero3/test_block_leaves.py::test_left_alone"]),
    "moe-leaves": (["zero3/test_moe.py::test_fused_blocks_are_found_and_only_their_eager_path_becomes_a_leaf",
                    "multiproc/test_moe_training.py::test_an_accelerate_loop_gets_the_same_leaves_from_prepare"],
                   ["zero3/test_moe.py::test_off_another_stage_or_a_config_leaf_module_change_nothing"]),
    "built-whole": (["trainer/test_callback.py::test_warns_when_zero3_model_was_built_whole",
                     "checks/test_doors.py::test_prepare_reports_a_zero3_model_built_whole"],
                    ["trainer/test_callback.py::test_quiet_when_zero3_model_loaded_partitioned"]),
    "checkpointing-kwargs": (["trainer/test_callback.py::test_checkpointing_without_kwargs_is_non_reentrant",
                              "trainer/test_callback.py::"
                              "test_lora_checkpointing_without_kwargs_is_reentrant_only_where_non_reentrant_fails"],
                             ["trainer/test_callback.py::"
                              "test_quiet_about_the_users_choice_of_reentrant_checkpointing_and_keeps_it"]),
    "peft-recompute": (["trainer/test_callback.py::"
                        "test_non_reentrant_checkpointing_of_lora_is_stopped_only_before_the_deepspeed_fix",
                        "checks/test_doors.py::"
                        "test_prepare_stops_non_reentrant_lora_checkpointing_only_before_the_deepspeed_fix"],
                       ["trainer/test_callback.py::test_quiet_about_recompute_with_reentrant_lora_or_full_fine_tuning"]),
    "batch-padding": (["test_batch_padding.py::test_advice_fires_for_padding_to_the_longest_sample_on_a_gpu"],
                      ["test_batch_padding.py::"
                       "test_advice_is_quiet_where_padding_is_already_right_or_alignment_buys_nothing"]),
    "engine-drives": (["trainer/test_callback.py::test_fires_when_accelerate_use_cpu_swaps_deepspeed_for_ddp",
                       "trainer/test_callback.py::test_fires_when_stage3_is_configured_but_the_engine_did_not_partition"],
                      ["trainer/test_callback.py::test_quiet_engine_check_on_a_real_engine"]),
    "sequence-parallel-loss": (["multiproc/test_accelerate_readme_loop.py::"
                                "test_readme_loop_under_the_sequence_parallel_yaml_trains_on_the_whole_sequences_loss"],
                               ["checks/test_catalog.py::test_the_loss_is_left_alone_without_sequence_parallelism"]),
    "cache-off-while-checkpointing": (["checks/test_catalog.py::test_use_cache_goes_off_only_while_checkpointing"],
                                      ["checks/test_catalog.py::test_use_cache_goes_off_only_while_checkpointing"]),
    "offload-step-fixes": (["trainer/test_offload_overflow.py::test_fix_applied_under_offload_and_trains_the_same_bits",
                            "multiproc/test_accelerate_loop.py::test_prepare_applies_the_offload_fixes_the_trainer_gets"],
                           ["trainer/test_offload_overflow.py::test_quiet_without_offload"]),
    "leaf-release": (["checks/test_doors.py::"
                      "test_a_granularity_threshold_leaves_the_fast_leaf_path_for_the_ordinary_release"],
                     ["checks/test_doors.py::test_leaves_without_a_threshold_keep_deepspeeds_ordinary_release"]),
    "leaf-inputs": (["checks/test_doors.py::test_lora_with_decoder_layer_leaves_trains_as_lora_without_leaves",
                     "zero3/test_leaf_inputs.py::test_a_leaf_without_an_input_gradient_gets_one"],
                    ["checks/test_doors.py::test_lora_with_decoder_layer_leaves_trains_as_lora_without_leaves",
                     "zero3/test_leaf_inputs.py::test_quiet_without_trainable_leaves_or_outside_the_read_releases"]),
    "leaf-ranks": (["zero3/test_leaves_on_ranks.py::test_leaves_on_the_fast_path_are_a_warning_with_the_measurement",
                    "zero3/test_leaves_on_ranks.py::test_a_class_the_gate_has_not_covered_gets_an_info_line"],
                   ["zero3/test_leaves_on_ranks.py::test_quiet_on_one_rank_on_cpu_without_leaves_or_with_proven_leaves"]),
    "leaf-outputs": (["checks/test_doors.py::test_a_leaf_that_returns_a_model_output_stops_the_run_at_its_first_forward"],
                     ["checks/test_doors.py::test_leaves_that_return_tensors_train_as_the_model_without_leaves"]),
    "even-batches": (["multiproc/test_accelerate_loop.py::"
                      "test_uneven_batches_per_rank_are_named_up_front_and_stop_a_zero3_loop_within_seconds",
                      "test_batch_counts.py::test_lengths_that_differ_between_ranks_are_named_with_each_ranks_count"],
                     ["multiproc/test_accelerate_loop.py::test_a_save_on_one_rank_only_is_refused_and_writes_nothing",
                      "test_batch_counts.py::test_quiet_when_every_rank_has_as_many_batches_or_a_loader_has_no_length"]),
    "divergence-watch": (["multiproc/test_divergence.py::test_a_branch_on_one_rank_stops_every_rank_naming_both_modules",
                          "multiproc/test_divergence.py::test_the_accelerate_door_stops_a_branch_on_one_rank_too",
                          "multiproc/test_divergence.py::test_a_parameter_read_on_one_rank_stops_within_seconds_naming_it",
                          "multiproc/test_divergence.py::test_a_generate_on_one_rank_stops_within_seconds_naming_both_sides",
                          "multiproc/test_divergence.py::test_a_divergence_after_the_first_steps_is_caught_by_default"],
                         ["multiproc/test_divergence.py::test_quiet_when_ranks_agree_and_gone_after_the_first_steps",
                          "multiproc/test_divergence.py::test_quiet_by_default_checking_every_module_then_each_forward"]),
    "generation-in-step": (["multiproc/test_generation.py::test_unequal_generation_with_synced_gpus_false_finishes"],
                           ["checks/test_catalog.py::test_generate_is_left_alone_without_zero3_ranks"]),
    "vision-in-step": (["multiproc/test_vision_in_step.py::"
                        "test_mixed_modalities_train_keep_the_trace_and_stop_when_the_dummy_cannot_run"],
                       ["zero3/test_modalities.py::test_quiet_when_every_rank_has_the_same_passes"]),
    "checkpoint-complete": (["trainer/test_callback.py::"
                             "test_incomplete_checkpoint_fails_the_save_and_the_older_one_survives_rotation"],
                            ["trainer/test_callback.py::test_checkpoint_folders_verified_and_reloadable"]),
    "saved-model-reloads": (["checkpoints/test_saved_models.py::test_zero_size_tensors_are_caught",
                             "multiproc/test_accelerate_loop.py::test_a_save_on_one_rank_only_is_refused_and_writes_nothing"],
                            ["checkpoints/test_saved_models.py::test_good_folder_passes"]),
}


def _test_functions(path) -> set:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_check_names_a_firing_and_a_quiet_test_that_exist():
    assert sorted(COVERAGE) == sorted(CHECK_IDS)
    missing = []
    for check_id, (fires, quiet) in COVERAGE.items():
        assert fires and quiet, check_id
        for node in fires + quiet:
            file, name = node.split("::")
            if name not in _test_functions(REPO / "tests" / file):
                missing.append(f"{check_id}: {node}")
    assert missing == []


def test_the_docs_list_every_check_with_its_moment_and_off_switch():
    page = (REPO / "docs" / "run-checks.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in page.splitlines() if line.startswith("| `")}
    assert sorted(rows) == sorted(CHECK_IDS)
    for check in CHECKS:
        assert f"| {', '.join(check.moments)} | {check.severity} | {check.kind} |" in rows[check.id], check.id


def _tiny_model():
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, vocab_size=97))


def test_use_cache_goes_off_only_while_checkpointing():
    model = _tiny_model()
    run = RunContext("accelerate", {"zero_optimization": {"stage": 3}}, model=model)
    cache_off_while_checkpointing(run)
    assert model.config.use_cache is True  # no checkpointing: the cache stays
    enable_model_checkpointing(model, {"use_reentrant": False})
    cache_off_while_checkpointing(run)
    assert model.config.use_cache is False


def test_generate_is_left_alone_without_zero3_ranks():
    model = _tiny_model()
    generate = model.generate
    generation_in_step(RunContext("trainer", {"zero_optimization": {"stage": 3}}, engine=model, model=model))
    assert model.generate == generate  # no DeepSpeed engine on several ranks: nothing can diverge


@pytest.mark.parametrize("skip, fires", [(["host-memory"], None), (["host_memory"], "not check ids"),
                                         ("host-memory", "one string"), ([], None)])
def test_skip_checks_takes_known_ids_only(skip, fires):
    try:
        check_options(skip_checks=skip)
    except ConfigError as e:
        assert fires and fires in str(e) and "host-memory" in str(e)
    else:
        assert fires is None


def test_model_checkpointing_kwargs_are_read_from_the_model():
    from hf_zero.compat.hf_api import model_checkpointing_kwargs

    model = _tiny_model()
    assert model_checkpointing_kwargs(model) is None
    enable_model_checkpointing(model, {"use_reentrant": True})
    assert model_checkpointing_kwargs(model) == {"use_reentrant": True}


def test_the_loss_is_left_alone_without_sequence_parallelism():
    model = _tiny_model()
    forward = model.forward
    assert sequence_parallel_loss(RunContext("accelerate", {"zero_optimization": {"stage": 3}}, engine=model)) == []
    assert model.forward == forward


def _zero3_with_leaves():  # with leaf modules: the threshold GPU-tuned configs set (DeepSpeed's default is 0)
    import hf_zero

    config = hf_zero.load_config("zero3")
    config["zero_optimization"]["stage3_module_granularity_threshold"] = 5_000_000
    return config


def _leaves(model):
    from hf_zero.compat.deepspeed_api import is_leaf

    return [name for name, module in model.named_modules() if is_leaf(module)]


def test_a_threshold_that_makes_the_whole_model_one_leaf_keeps_its_layers():
    # the tiny Llama: far fewer parameters per module than 5e6, so DeepSpeed would make the whole model
    # (a ModelOutput) one leaf; then LlamaModel (also one); the decoder layers below are leaves instead
    config = _zero3_with_leaves()
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, vocab_size=97))
    [note] = model_leaves(RunContext("trainer", config, model=model))
    assert "leaf of the whole model (LlamaForCausalLM), which returns a ModelOutput" in note
    assert "would never train" in note and "The 2 modules the threshold picks below it" in note
    assert config["zero_optimization"]["stage3_module_granularity_threshold"] == 0
    assert _leaves(model) == ["model.layers.0", "model.layers.1"]


def test_a_threshold_that_makes_a_vision_tower_a_leaf_keeps_the_other_leaves():
    # Qwen2-VL-2B's shape (on the meta device): above DeepSpeed's 1e9 cap the whole model is no leaf, but its 665M
    # vision tower (Qwen2VisionTransformerPretrainedModel, a ModelOutput) would be, beside the 28 decoder layers
    import transformers

    def qwen2_vl_2b():
        text = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                    num_key_value_heads=2, vocab_size=151936,
                    rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1e6})
        vision = dict(depth=32, embed_dim=1280, hidden_size=1536, mlp_ratio=4, num_heads=16, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2)
        with torch.device("meta"):
            return transformers.Qwen2VLForConditionalGeneration(transformers.Qwen2VLConfig(
                text_config=text, vision_config=vision, tie_word_embeddings=True))

    model, config = qwen2_vl_2b(), _zero3_with_leaves()
    [note] = model_leaves(RunContext("trainer", config, model=model))
    assert "leaf of model.visual (Qwen2VisionTransformerPretrainedModel)" in note
    assert config["zero_optimization"]["stage3_module_granularity_threshold"] == 0
    leaves = _leaves(model)
    # the decoder layers stay leaves; inside the tower the rule goes on: its blocks become leaves
    assert [f"model.language_model.layers.{i}" for i in range(28)] == [n for n in leaves if "language_model" in n]
    assert [f"model.visual.blocks.{i}" for i in range(32)] == [n for n in leaves if n.startswith("model.visual.blocks.")]
    # quiet where the tower is frozen: it has no gradients to lose, and the threshold stays as DeepSpeed reads it
    frozen, config = qwen2_vl_2b(), _zero3_with_leaves()
    frozen.model.visual.requires_grad_(False)
    assert model_leaves(RunContext("trainer", config, model=frozen)) == []
    assert config["zero_optimization"]["stage3_module_granularity_threshold"] == 5_000_000 and _leaves(frozen) == []


def test_a_threshold_that_makes_decoder_layers_leaves_is_kept():
    # the 1.35B benchmark model (on the meta device): above DeepSpeed's 1e9 cap the whole model never becomes a leaf,
    # its decoder layers (4.2M parameters per module) do
    from transformers import AutoModelForCausalLM

    from hf_zero.model_configs import build_config, resolve_model

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(build_config(resolve_model("1.35b")[1]))
    config = _zero3_with_leaves()
    assert model_leaves(RunContext("trainer", config, model=model)) == []
    assert config["zero_optimization"]["stage3_module_granularity_threshold"] == 5_000_000 and _leaves(model) == []
    stage2 = {"zero_optimization": {"stage": 2}}
    assert model_leaves(RunContext("trainer", stage2, model=_tiny_model())) == []


def test_a_fix_or_a_guard_is_reported_as_ran_never_as_a_check_that_passed():
    assert {c.kind for c in CHECKS} == {"check", "fix", "guard"}
    fixes = [c.id for c in CHECKS if c.kind != "check"]
    assert "cache-off-while-checkpointing" in fixes and "divergence-watch" in fixes
    model = _tiny_model()
    run = RunContext("accelerate", {"zero_optimization": {"stage": 2}}, model=model, engine=model)
    run_moment([c for c in CHECKS if c.id in ("cache-off-while-checkpointing", "leaf-release")], "engine", run)
    assert run.ran == [("engine", "cache-off-while-checkpointing", "ran"), ("engine", "leaf-release", "quiet")]


def _finding_codes_in_source() -> set:
    """The code of every Finding(...) the config linter builds (its first argument, a string literal)."""
    codes = set()
    for path in (REPO / "hf_zero" / "config").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding" and node.args:
                codes.add(node.args[0].value)
    return codes


def test_every_config_finding_has_its_own_id_and_the_docs_list_each():
    assert _finding_codes_in_source() == set(FINDING_CODES)
    finding_ids = {f"deepspeed-config/{code}" for code in FINDING_CODES}
    assert set(SKIP_IDS) == set(CHECK_IDS) | finding_ids
    page = (REPO / "docs" / "run-checks.md").read_text()
    assert set(re.findall(r"`(deepspeed-config/[a-z0-9-]+)`", page)) == finding_ids


def _config_run(skip=()):
    import hf_zero

    config = hf_zero.load_config("zero2")
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 10  # stage3-key-in-stage12, a warning
    config["bogus"] = 1  # unknown-key, an error
    run = RunContext("accelerate", config, skip=frozenset(skip))
    errors = run_moment([c for c in CHECKS if c.id == "deepspeed-config"], "config", run)
    return errors, [w for w in run.warnings if "stage-3 keys" in w]


def test_one_config_finding_is_skipped_by_its_own_id_and_all_by_the_checks():
    errors, warnings = _config_run()
    assert [e for e in errors if "'bogus'" in e] == [
        "DeepSpeed silently ignores the top-level key 'bogus'. Fix: remove it or correct its spelling (see "
        "deepspeed.ai/docs/config-json). [check deepspeed-config/unknown-key]"] and len(warnings) == 1
    errors, warnings = _config_run(["deepspeed-config/unknown-key"])
    assert not any("'bogus'" in e for e in errors) and len(warnings) == 1  # that finding alone
    errors, warnings = _config_run(["deepspeed-config/stage3-key-in-stage12"])
    assert any("'bogus'" in e for e in errors) and warnings == []
    assert _config_run(["deepspeed-config"]) == ([], [])  # the users' setting of before: every finding
    check_options(skip_checks=["deepspeed-config/unknown-key", "deepspeed-config"])
    with pytest.raises(ConfigError, match=r"deepspeed-config/nope'\], which are not check ids.*<id>/<code>"):
        check_options(skip_checks=["deepspeed-config/nope"])
