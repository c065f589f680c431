"""ZeroCallback reaches the Trainer the ways every TrainerCallback does, and prepares the run before the engine."""

import json

import pytest
import torch
import transformers

import hf_zero
from conftest import assert_reload_bitwise, read_result, run_worker


def _gather_off(tmp_path):
    config = hf_zero.load_config("zero3")
    config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = False
    path = tmp_path / "gather_off.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.multiproc
@pytest.mark.parametrize("mode", ["instance",
                                  # add_callback and the class take the instance's path once the Trainer holds
                                  # the callback: make test-long
                                  pytest.param("add-callback", marks=pytest.mark.slow),
                                  pytest.param("class", marks=pytest.mark.slow)])
def test_every_way_of_passing_the_callback_prepares_the_run_before_the_engine(tiny_models, tmp_path, mode):
    """Gathering off and gradient checkpointing: both need fixing before DeepSpeed builds its engine."""
    out = tmp_path / "run"
    run_worker(["--model", tiny_models["llama"], "--out", out, "--deepspeed", _gather_off(tmp_path), "--gc",
                "--callback", mode], nproc=2)
    result = read_result(out)
    assert result["zero_callbacks"] == 1 and result["first_callback"] == "ZeroCallback"
    assert any("stage3_gather_16bit_weights_on_model_save was off" in w for w in result["warnings"])
    assert result["use_reentrant"] is False
    assert (out / "final" / "model.safetensors").exists()
    assert_reload_bitwise(out)


@pytest.mark.multiproc
def test_two_callbacks_on_one_trainer_are_refused(tiny_models, tmp_path):
    proc = run_worker(["--model", tiny_models["llama"], "--out", tmp_path / "run", "--deepspeed", "zero2",
                       "--callback", "twice"], expect_fail=True)
    assert "has a ZeroCallback already" in proc.stderr and "pass it once" in proc.stderr
    assert "Traceback" not in proc.stderr.split("ConfigError")[-1]


def _plain_trainer(tiny_models, tmp_path, callbacks=None):
    """A Trainer without DeepSpeed: ZeroCallback has nothing to check, so it can be wired in-process."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_models["llama"], dtype=torch.float32)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    return transformers.Trainer(model=model, args=args, callbacks=callbacks)


def test_attach_keeps_the_callback_the_trainer_already_has(tiny_models, tmp_path):
    given = hf_zero.ZeroCallback()
    trainer = _plain_trainer(tiny_models, tmp_path, callbacks=[given])
    assert given.trainer is trainer  # found at on_init_end
    assert hf_zero.attach(trainer) is given
    assert trainer.callback_handler.callbacks[0] is given
    assert [type(c) for c in trainer.callback_handler.callbacks].count(hf_zero.ZeroCallback) == 1


def test_attach_with_other_options_than_the_trainers_callback_is_refused(tiny_models, tmp_path):
    trainer = _plain_trainer(tiny_models, tmp_path, callbacks=[hf_zero.ZeroCallback()])
    with pytest.raises(hf_zero.ConfigError, match="has a ZeroCallback already.*log_memory"):
        hf_zero.attach(trainer, log_memory=False)


def test_one_callback_serves_one_trainer(tiny_models, tmp_path):
    callback = hf_zero.attach(_plain_trainer(tiny_models, tmp_path / "a"))
    with pytest.raises(hf_zero.ConfigError, match="already serves another Trainer"):
        callback.attach(_plain_trainer(tiny_models, tmp_path / "b"))


def test_attach_needs_a_trainer():
    with pytest.raises(TypeError, match="needs a transformers Trainer"):
        hf_zero.attach(object())


# ---- the launch glue for any TrainingArguments class ----------------------------------------------

def test_zero_arguments_gives_any_arguments_class_the_glue(tmp_path):
    from hf_zero.trainer.training_args import has_launch_glue

    glued = hf_zero.zero_arguments(transformers.Seq2SeqTrainingArguments)
    assert issubclass(glued, transformers.Seq2SeqTrainingArguments) and has_launch_glue(glued)
    assert hf_zero.zero_arguments(glued) is glued and hf_zero.zero_arguments(transformers.Seq2SeqTrainingArguments) is glued
    assert hf_zero.zero_arguments(transformers.TrainingArguments) is hf_zero.TrainingArguments
    [args] = transformers.HfArgumentParser(glued).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--deepspeed", "zero2", "--predict_with_generate", "--report_to", "none"])
    assert args.predict_with_generate and isinstance(args.deepspeed, dict)  # the preset name resolved
    assert args.deepspeed["zero_optimization"]["stage"] == 2
    if not torch.cuda.is_available():
        assert args.use_cpu
    import pickle

    assert pickle.loads(pickle.dumps(args)).output_dir == str(tmp_path)  # the Trainer pickles it into checkpoints


def test_plain_arguments_class_has_no_glue(tmp_path):
    from hf_zero.trainer.training_args import has_launch_glue

    assert not has_launch_glue(transformers.Seq2SeqTrainingArguments)
    args = transformers.Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to=[])
    assert not hasattr(args, "nvme_path")


def test_zero_arguments_refuses_what_is_not_an_arguments_class():
    for wrong in (dict, transformers.TrainingArguments(output_dir="x", report_to=[]), "SFTConfig"):
        with pytest.raises(TypeError, match="takes a TrainingArguments class"):
            hf_zero.zero_arguments(wrong)


@pytest.mark.multiproc
@pytest.mark.slow  # a run of its own; the glue itself is tested above without training
def test_a_glued_seq2seq_arguments_class_trains_zero3_on_two_cpu_ranks(tiny_models, tmp_path):
    out = tmp_path / "run"
    run_worker(["--model", tiny_models["llama"], "--out", out, "--deepspeed", "zero3", "--args-class", "seq2seq",
                "--callback", "instance"], nproc=2)
    result = read_result(out)
    assert result["dp_world_size"] == 2 and result["partitioned_at_load"] is True
    assert_reload_bitwise(out)


@pytest.mark.parametrize("name", ["SFTConfig", "DPOConfig", "GRPOConfig", "KTOConfig", "RewardConfig"])
def test_zero_arguments_glues_trls_configs_and_the_parser_still_parses_them(name, tmp_path):
    import trl  # the test extra: a missing TRL fails here, it does not skip
    glued = hf_zero.zero_arguments(getattr(trl, name))
    [args] = transformers.HfArgumentParser(glued).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--deepspeed", "zero3", "--report_to", "none"])
    assert isinstance(args, getattr(trl, name)) and args.deepspeed["zero_optimization"]["stage"] == 3
