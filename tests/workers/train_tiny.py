"""A short Trainer run of a tiny model under DeepSpeed, as the tests launch it.

Launch-agnostic on purpose: the tests start it with python, torchrun, deepspeed and
accelerate. Rank 0 writes result.json and the engine's gathered weights (expected.safetensors)
next to the saved model, so the test can compare the reload tensor by tensor.
"""

import argparse
import json
import os
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, Trainer

import deprecation_guard  # noqa: F401  (hf_zero calling a deprecated API fails the run)
import hf_zero
from hf_zero.compat.deepspeed_api import is_leaf
from hf_zero.compat.hf_api import checkpointing_arg_name


# transformers 5.23 renamed gradient_checkpointing (kept as a deprecated alias): the newest spelling
CHECKPOINTING_ARG = checkpointing_arg_name(transformers.TrainingArguments)


# "warmup": the learning rate moves every step (logged 0.5e-3, 1e-3, 0.5e-3, 0 over 4 steps), so a resume that lost
# the scheduler's state (or restarted it) shows in the learning rates and losses it logs
SCHEDULES = {"constant": dict(lr_scheduler_type="constant"),
             "warmup": dict(lr_scheduler_type="linear", warmup_steps=2)}


def reentrant_kwargs(opts) -> dict:
    """--reentrant true|false: the user's own gradient-checkpointing kwargs; left out, ZeroCallback picks them."""
    if opts.reentrant is None:
        return {}
    return {f"{CHECKPOINTING_ARG}_kwargs": {"use_reentrant": opts.reentrant == "true"}}


def build_args(opts):
    common = dict(
        output_dir=opts.out, per_device_train_batch_size=2, gradient_accumulation_steps=opts.accum,
        max_steps=opts.steps, learning_rate=1e-3, logging_steps=1, report_to=[], seed=0,
        save_strategy="steps" if opts.save_steps else "no", save_steps=opts.save_steps or 500,
        bf16=opts.bf16, **{CHECKPOINTING_ARG: opts.gc}, disable_tqdm=True, **SCHEDULES[opts.schedule],
        deepspeed=opts.deepspeed, save_total_limit=opts.save_total_limit, torch_compile=opts.torch_compile,
        **reentrant_kwargs(opts),
    )
    if opts.plain_args:
        # What a user's unmodified script does: transformers' own arguments, no CPU glue.
        if common["deepspeed"] and not common["deepspeed"].endswith(".json"):
            common["deepspeed"] = str(hf_zero.preset_path(common["deepspeed"]))
        return transformers.TrainingArguments(**common)
    if opts.args_class == "seq2seq":
        # any TrainingArguments class, glued in one line; HfArgumentParser parses it like the original
        args_class = hf_zero.zero_arguments(transformers.Seq2SeqTrainingArguments)
        flags = [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in common.items()
                 if v is not None and not isinstance(v, list)] + ["--report_to", "none"]
        [parsed] = transformers.HfArgumentParser(args_class).parse_args_into_dataclasses(flags)
        return parsed
    return hf_zero.TrainingArguments(nvme_path=opts.nvme_path, **common)


class RandomTokens(torch.utils.data.Dataset):
    """Random sequences of 16 distinct tokens (ids 3-18): learnable in a few steps (the model learns which tokens
    occur), so a run that trains shows a falling loss; a uniform draw over the whole vocabulary would not."""

    def __init__(self, task, vocab, n=64, length=16, num_labels=2, distinct=16):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(3, min(vocab, 3 + distinct), (n, length), generator=g)
        self.cls_labels = torch.randint(0, num_labels, (n,), generator=g)
        self.task = task

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        if self.task == "cls":
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.cls_labels[i]}
        return {"input_ids": ids, "labels": ids.clone()}


class PeakStateBytes(transformers.TrainerCallback):
    """Live tensor bytes just before each optimizer step: gradients, master weights and Adam states all
    exist then, and the activations are gone, so this is the model-state peak the planner predicts."""

    def __init__(self, trainer):
        self.trainer, self.peak = trainer, 0

    def on_train_begin(self, args, state, control, **kwargs):
        inner = getattr(self.trainer.model_wrapped, "optimizer", None)
        inner = getattr(inner, "optimizer", inner)  # the torch optimizer inside DeepSpeed's ZeRO optimizer
        if isinstance(inner, torch.optim.Optimizer):
            inner.register_step_pre_hook(lambda *_: setattr(self, "peak", max(self.peak, live_tensor_bytes())))


class LoggedKeys(transformers.TrainerCallback):
    def __init__(self):
        self.keys = set()

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.keys.update(logs or {})


def live_tensor_bytes() -> int:
    """Bytes of every distinct tensor storage alive in this process (what DeepSpeed keeps between steps)."""
    import gc

    storages = {}
    for obj in gc.get_objects():
        try:
            if torch.is_tensor(obj) and obj.device.type == "cpu":
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        except Exception:  # tensors without storage (meta, sparse wrappers)
            continue
    return sum(storages.values())


def kill_midway_through_save(step: int) -> None:
    """A crash in the middle of a checkpoint: the optimizer shard of `step` is cut in half, then SIGKILL
    (no cleanup, no exception handlers), as when a node dies or the OOM killer strikes."""
    import signal

    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        if isinstance(f, (str, os.PathLike)) and f"global_step{step}" in str(f) and "optim_states" in str(f):
            size = os.path.getsize(f)
            os.truncate(f, size // 2)
            os.kill(os.getpid(), signal.SIGKILL)

    torch.save = save  # DeepSpeed's checkpoint engine calls torch.save(state, path)


def corrupt_at_save(step: int) -> None:
    """A save that completes but is wrong: the optimizer shard of `step` is cut in half after writing, and the run
    goes on (a full disk, a flaky network filesystem). The Trainer then writes trainer_state.json and rotates."""
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        if isinstance(f, (str, os.PathLike)) and f"global_step{step}" in str(f) and "optim_states" in str(f):
            os.truncate(f, os.path.getsize(f) // 2)

    torch.save = save


class StepsTrained(transformers.TrainerCallback):
    """The global steps this process trained (a resumed run starts after its checkpoint)."""

    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--task", default="causal", choices=["causal", "cls"])
    p.add_argument("--deepspeed", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--save-steps", type=int, default=0)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--gc", action="store_true")
    p.add_argument("--reentrant", choices=["true", "false"], default=None, help="gradient_checkpointing_kwargs' use_reentrant")
    p.add_argument("--plain-args", action="store_true")
    p.add_argument("--args-class", default="hf_zero", choices=["hf_zero", "seq2seq"],
                   help="seq2seq: hf_zero.zero_arguments(Seq2SeqTrainingArguments), parsed by HfArgumentParser")
    p.add_argument("--load", default="after-args", choices=["after-args", "hf-zero", "whole"])
    p.add_argument("--no-attach", action="store_true")
    p.add_argument("--callback-in-list", action="store_true", help="Trainer(callbacks=[ZeroCallback()]) instead of attach")
    p.add_argument("--callback", default=None, choices=["attach", "instance", "class", "add-callback", "twice"],
                   help="how ZeroCallback reaches the Trainer: hf_zero.attach(trainer), callbacks=[ZeroCallback()], "
                        "callbacks=[ZeroCallback], trainer.add_callback(ZeroCallback()), or two in the list")
    p.add_argument("--nvme-path", default=None)
    p.add_argument("--resume", default=None, help="'last' (hf_zero.prepare_resume finds it) or a checkpoint folder")
    p.add_argument("--plain-resume", default=None, help="trainer.train(resume_from_checkpoint=PATH), without hf_zero")
    p.add_argument("--save-total-limit", type=int, default=None)
    p.add_argument("--kill-during-save", type=int, default=None, metavar="STEP",
                   help="rank 1 writes half of its optimizer shard at STEP's save, then SIGKILLs itself")
    p.add_argument("--torch-compile", action="store_true", help="TrainingArguments(torch_compile=True)")
    p.add_argument("--schedule", default="constant", choices=sorted(SCHEDULES))
    p.add_argument("--corrupt-save", type=int, default=None, metavar="STEP",
                   help="rank 0 truncates its optimizer shard at STEP's save and trains on")
    p.add_argument("--stage-after-attach", type=int, default=None,
                   help="change the live config's ZeRO stage after hf_zero.attach (the engine is built from it)")
    p.add_argument("--world-size-after-attach", type=int, default=None,
                   help="set WORLD_SIZE after hf_zero.attach, so the engine's data-parallel size differs from it")
    p.add_argument("--length", type=int, default=16, help="tokens per sample")
    p.add_argument("--long-context", action="store_true", help="hf_zero.attach(trainer, long_context=True)")
    p.add_argument("--local_rank", type=int, default=None, help="set by the deepspeed launcher")
    opts = p.parse_args()

    model_class = AutoModelForSequenceClassification if opts.task == "cls" else AutoModelForCausalLM
    dtype = torch.bfloat16 if opts.bf16 else torch.float32
    model = None
    if opts.load == "whole":
        model = model_class.from_pretrained(opts.model, dtype=dtype)  # before any DeepSpeed config exists
    elif opts.load == "hf-zero":
        model = hf_zero.from_pretrained(model_class, opts.model, opts.deepspeed or "zero3", dtype=dtype,
                                        nvme_path=opts.nvme_path)
    args = build_args(opts)
    if model is None:
        model = model_class.from_pretrained(opts.model, dtype=dtype)  # zero.Init through TrainingArguments
    partitioned_at_load = hf_zero.is_partitioned(model)

    data = RandomTokens(opts.task, model.config.vocab_size, length=opts.length)
    mode = opts.callback or ("instance" if opts.callback_in_list else None if opts.no_attach else "attach")
    in_list = {"instance": [hf_zero.ZeroCallback()], "class": [hf_zero.ZeroCallback], "twice": [hf_zero.ZeroCallback(), hf_zero.ZeroCallback()]}.get(mode)
    # a tokenizer saved beside the model goes into every checkpoint, as in a real fine-tune
    tokenizer = transformers.AutoTokenizer.from_pretrained(opts.model) if (Path(opts.model) / "tokenizer_config.json").exists() else None
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=in_list, processing_class=tokenizer)
    if mode == "attach":
        hf_zero.attach(trainer, **({"long_context": True} if opts.long_context else {}))
    elif mode == "add-callback":
        trainer.add_callback(hf_zero.ZeroCallback())
    logged = LoggedKeys()
    trainer.add_callback(logged)
    steps_trained = StepsTrained()
    trainer.add_callback(steps_trained)
    if opts.stage_after_attach is not None:
        hf_zero.config.live.deepspeed_config_of(args)["zero_optimization"]["stage"] = opts.stage_after_attach
    if opts.world_size_after_attach is not None:
        os.environ["WORLD_SIZE"] = str(opts.world_size_after_attach)
    if opts.corrupt_save is not None and os.environ.get("RANK", "0") == "0":
        corrupt_at_save(opts.corrupt_save)
    peak_states = PeakStateBytes(trainer)
    trainer.add_callback(peak_states)  # last in line, like TensorBoard/W&B: sees what they would see
    if opts.kill_during_save is not None and os.environ.get("RANK") == "1":
        kill_midway_through_save(opts.kill_during_save)
    resume = opts.plain_resume
    if opts.resume:
        resume = hf_zero.prepare_resume(trainer, True if opts.resume == "last" else opts.resume)
    trainer.train(resume_from_checkpoint=resume)
    callback = next((c for c in trainer.callback_handler.callbacks if isinstance(c, hf_zero.ZeroCallback)), None)

    expected = hf_zero.gathered_state_dict(trainer.model)
    final = Path(opts.out) / "final"
    trainer.save_model(str(final))
    if trainer.is_world_process_zero():
        from safetensors.torch import save_file
        from torch._dynamo.utils import counters as dynamo_counters

        save_file(expected, str(Path(opts.out) / "expected.safetensors"))
        engine = trainer.model_wrapped
        result = {
            "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
            "loss_steps": [e["step"] for e in trainer.state.log_history if "loss" in e],
            "resumed_from": resume,
            "steps_trained": steps_trained.steps,
            "learning_rates": [e["learning_rate"] for e in trainer.state.log_history if "loss" in e],
            "engine": type(engine).__name__,
            "zero_stage": engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else None,
            "reduce_bucket_size": getattr(getattr(getattr(engine, "_config", None), "zero_config", None),
                                          "reduce_bucket_size", None),
            # the torch optimizer inside DeepSpeed's ZeRO optimizer: which Adam runs the step
            "optimizer": type(getattr(getattr(engine, "optimizer", None), "optimizer", None)).__name__,
            "dp_world_size": getattr(engine, "dp_world_size", None),
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "partitioned_at_load": partitioned_at_load,
            # the ZeRO-3 leaves the engine was built with (hf_zero's block-leaves, a user's, the compile path's)
            "leaves": [type(m).__name__ for m in trainer.model.modules() if is_leaf(m)],
            "peak_state_bytes": peak_states.peak,
            "params": sum(getattr(p, "ds_numel", p.numel()) for p in trainer.model.parameters()),
            "warnings": callback.warnings if callback else [],
            "checks_ran": [list(entry) for entry in callback.run.ran] if callback and callback.run else [],
            "zero_callbacks": [type(c).__name__ for c in trainer.callback_handler.callbacks].count("ZeroCallback"),
            "first_callback": type(trainer.callback_handler.callbacks[0]).__name__,
            "compiled_block_forwards": sum(hasattr(m.__dict__.get("forward"), "_torchdynamo_orig_callable")
                                           for m in trainer.model.modules()),
            "linear_is_torch": torch.nn.functional.linear is torch._C._nn.linear,
            "dynamo_graphs": dynamo_counters["stats"]["unique_graphs"],
            "use_reentrant": (getattr(args, "activation_checkpointing_kwargs", None)
                              or getattr(args, "gradient_checkpointing_kwargs", None) or {}).get("use_reentrant"),
        }
        (Path(opts.out) / "logged_keys.json").write_text(json.dumps(sorted(logged.keys)))
        (Path(opts.out) / "result.json").write_text(json.dumps(result, indent=1))
    hf_zero.shutdown()
    print("hf_zero-test: worker finished", flush=True)  # conftest.FINISHED: all work done, only teardown left


if __name__ == "__main__":
    main()
