"""ZeroCallback's attach-time checks, each with a real Trainer and a real DeepSpeed config, in one process.

No engine is built: every check here runs in ``hf_zero.attach(trainer)``, before ``trainer.train()``.
Each scenario builds its own TrainingArguments, model and Trainer, attaches, and records the callback's
warnings (or the error it raised) and what it changed; the results go to OUT/attach_checks.json, one
entry per scenario, for tests/trainer/test_callback.py.
"""

import json
import os
from pathlib import Path

import psutil
import torch
import transformers
from transformers import AutoModelForCausalLM, Trainer

import deprecation_guard  # noqa: F401  (hf_zero calling a deprecated API fails the run)
import hf_zero
from hf_zero.compat.hf_api import checkpointing_arg_name, checkpointing_kwargs
from hf_zero.config.live import deepspeed_config_of
from hf_zero.trainer import default_checkpointing_kwargs, peft_recompute_problems
from scenario_runner import main, reset_accelerate


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        ids = torch.arange(3, 19)
        return {"input_ids": ids, "labels": ids.clone()}


def config_file(out: Path, name: str, preset: str, **zero) -> str:
    config = hf_zero.load_config(preset)
    config["zero_optimization"].update(zero)
    path = out / f"{name}.json"
    path.write_text(json.dumps(config))
    return str(path)


def attach(model_path, args, *, bf16_model=False, lora=False, attn=None, model=None, **callback_options):
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16 if bf16_model else torch.float32,
                                                     **({"attn_implementation": attn} if attn else {}))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    trainer = Trainer(model=model, args=args, train_dataset=Tokens())
    callback = hf_zero.attach(trainer, **callback_options)
    return trainer, callback


def scenarios(model_path: str, out: Path):
    common = dict(output_dir=str(out / "run"), per_device_train_batch_size=2, max_steps=1, report_to=[],
                  disable_tqdm=True)

    def hf_args(deepspeed, **extra):
        return hf_zero.TrainingArguments(deepspeed=deepspeed, **common, **extra)

    def plain_args(preset, **extra):  # transformers' own arguments, as a user's unmodified script has them
        return transformers.TrainingArguments(deepspeed=str(hf_zero.preset_path(preset)), use_cpu=True, **common, **extra)

    def leaf_threshold(trainer):
        return deepspeed_config_of(trainer.args)["zero_optimization"].get("stage3_module_granularity_threshold")

    def run(name, make):
        reset_accelerate()
        try:
            trainer, callback = make()
            extra = getattr(make, "extra", lambda t: {})(trainer)
            return name, {"warnings": callback.warnings, "error": None, **extra}
        except hf_zero.ConfigError as e:
            return name, {"warnings": [], "error": str(e)}

    def with_extra(make, extra):
        make.extra = extra
        return make

    # a leaf-module threshold (GPU-only) is dropped, and said, under transformers' own arguments
    with_leaves = config_file(out, "zero3_leaves", "zero3", stage3_module_granularity_threshold=5_000_000)
    yield run("gpu_only_dropped", with_extra(lambda: attach(model_path, transformers.TrainingArguments(
        deepspeed=with_leaves, use_cpu=True, **common)), lambda t: {"leaf_threshold": leaf_threshold(t)}))
    yield run("gpu_only_absent", with_extra(lambda: attach(model_path, plain_args("zero2")), lambda t: {}))
    # a config finding of severity warning becomes a callback warning
    yield run("finding_warning", lambda: attach(model_path, hf_args(config_file(
        out, "zero2_stage3_key", "zero2", stage3_param_persistence_threshold=10))))
    yield run("finding_none", lambda: attach(model_path, hf_args("zero2")))
    # ... and skipped by its own id alone
    yield run("finding_warning_skipped", lambda: attach(model_path, hf_args(config_file(
        out, "zero2_stage3_key", "zero2", stage3_param_persistence_threshold=10)),
        skip_checks=["deepspeed-config/stage3-key-in-stage12"]))
    # gradient checkpointing: the user's use_reentrant kept as given, non-reentrant when none was given
    # the newest spelling (transformers 5.23 renamed it; the old one warns there)
    name = checkpointing_arg_name(transformers.TrainingArguments)
    gc = {name: True}

    def gc_kwargs(kwargs):
        return {f"{name}_kwargs": kwargs}

    def reentrant(trainer):
        return {"use_reentrant": (checkpointing_kwargs(trainer.args) or {}).get("use_reentrant")}

    def recompute_problems(trainer):  # the same real args and model, judged as two DeepSpeed releases would run them
        return {version: peft_recompute_problems(trainer.model, trainer.args, version) for version in ("0.19.2", "0.19.3")}

    yield run("reentrant_zero3", with_extra(lambda: attach(model_path, hf_args(
        "zero3", **gc, **gc_kwargs({"use_reentrant": True}))), reentrant))
    yield run("reentrant_zero2", with_extra(lambda: attach(model_path, hf_args(
        "zero2", **gc, **gc_kwargs({"use_reentrant": True}))), reentrant))
    yield run("non_reentrant_zero3", with_extra(lambda: attach(model_path, hf_args(
        "zero3", **gc, **gc_kwargs({"use_reentrant": False}))), reentrant))
    yield run("default_checkpointing_zero3", with_extra(lambda: attach(model_path, hf_args("zero3", **gc)), reentrant))
    # LoRA (frozen base) under ZeRO-3 with gradient checkpointing: non-reentrant fails before DeepSpeed 0.19.3
    for use_reentrant in (False, True):
        yield run(f"lora_reentrant_{use_reentrant}_zero3", with_extra(lambda: attach(model_path, hf_args(
            "zero3", **gc, **gc_kwargs({"use_reentrant": use_reentrant})), lora=True), recompute_problems))
    # no kwargs given: what ZeroCallback picked (installed DeepSpeed) and what it picks for one without the fix
    def picked_defaults(trainer):
        return {**reentrant(trainer), "0.19.2": default_checkpointing_kwargs(trainer.model, trainer.args, "0.19.2")}

    yield run("lora_default_checkpointing_zero3", with_extra(lambda: attach(model_path, hf_args("zero3", **gc), lora=True),
                                                             picked_defaults))
    yield run("full_non_reentrant_zero3", with_extra(lambda: attach(model_path, hf_args(
        "zero3", **gc, **gc_kwargs({"use_reentrant": False}))), recompute_problems))
    # force_gather_on_save=False: gathering off is refused, gathering on is fine
    gather_off = config_file(out, "zero3_gather_off", "zero3", stage3_gather_16bit_weights_on_model_save=False)
    yield run("no_force_gather_off", lambda: attach(model_path, hf_args(gather_off), force_gather_on_save=False))
    yield run("no_force_gather_on", lambda: attach(model_path, hf_args("zero3"), force_gather_on_save=False))
    # peft's fp32 adapters on a bf16 base under ZeRO-3: cast by default, kept with cast_adapters=False
    def adapter_dtypes(trainer):
        return {"adapter_dtypes": sorted({str(p.dtype) for p in trainer.model.parameters() if p.requires_grad})}

    yield run("cast_adapters", with_extra(lambda: attach(model_path, hf_args("zero3", bf16=True), bf16_model=True,
                                                         lora=True), adapter_dtypes))
    yield run("keep_adapters", with_extra(lambda: attach(model_path, hf_args("zero3", bf16=True), bf16_model=True,
                                                         lora=True, cast_adapters=False), adapter_dtypes))
    # a host smaller than the model states (the node's memory as psutil reports it, 1 MiB): refused, or let through
    # with the one option that skips the check
    def skipped(trainer):
        callback = next(c for c in trainer.callback_handler.callbacks if isinstance(c, hf_zero.ZeroCallback))
        return {"skipped": [list(entry) for entry in callback.run.ran if entry[2] == "skipped"]}

    # long_context: a model that cannot run a part is refused with the fix (eager attention: memory grows with the
    # square of the sequence); one that can gets the parts, and checkpointing for offload_activations; the refusal
    # skipped by its id lets the parts on
    def long_context_state(trainer):
        from hf_zero.compat.hf_api import checkpointing_on
        from hf_zero.long_context import long_context_of

        parts = long_context_of(trainer.model)
        return {"long_context": parts.as_dict() if parts else None, "checkpointing": checkpointing_on(trainer.args)}

    yield run("long_context_eager", lambda: attach(model_path, hf_args("zero2"), attn="eager", long_context=True))
    yield run("long_context_on", with_extra(lambda: attach(model_path, hf_args("zero2"), long_context=True),
                                            long_context_state))
    yield run("long_context_eager_skipped", with_extra(lambda: attach(
        model_path, hf_args("zero2"), attn="eager", long_context=True, skip_checks=["long-context"]), long_context_state))
    def no_deepspeed():
        # the Accelerators of the Trainers before left ACCELERATE_USE_DEEPSPEED set in this process, which would
        # give these arguments a DeepSpeed plugin; a script's own process starts without it
        os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)
        return transformers.TrainingArguments(use_cpu=True, **common)

    yield run("long_context_without_deepspeed", with_extra(lambda: attach(model_path, no_deepspeed(), long_context=True),
                                                           long_context_state))
    yield run("long_context_eager_without_deepspeed", lambda: attach(model_path, no_deepspeed(), attn="eager",
                                                                     long_context=True))

    # zero3_nvme's swap buffer below the largest parameter (the embedding, 256 x 64 = 16,384 elements) of a model
    # built whole: refused before the engine partitions it, quiet with the preset's buffer, let through when skipped
    def nvme(buffer_size, **options):
        model = AutoModelForCausalLM.from_pretrained(model_path)  # before the arguments: no zero.Init
        config = hf_zero.load_config("zero3_nvme", nvme_path=out)
        config["zero_optimization"]["offload_param"]["buffer_size"] = buffer_size
        path = out / f"zero3_nvme_{buffer_size}.json"
        path.write_text(json.dumps(config))
        return attach(model_path, hf_args(str(path)), model=model, **options)

    yield run("nvme_buffer_small", lambda: nvme(4096))
    yield run("nvme_buffer_preset", lambda: nvme(100_000_000))
    yield run("nvme_buffer_small_skipped", lambda: nvme(4096, skip_checks=["nvme-buffer-too-small"]))

    # an id skipped on the arguments (the check ran there) stays skipped in the callback's run of the same check
    bogus = out / "zero2_bogus.json"
    bogus.write_text(json.dumps({**hf_zero.load_config("zero2"), "bogus": 1}))
    yield run("arguments_skip_kept", lambda: attach(model_path, hf_args(
        str(bogus), skip_checks=["deepspeed-config/unknown-key"])))

    real = psutil.virtual_memory
    psutil.virtual_memory = lambda: real()._replace(total=2**20)
    try:
        yield run("host_memory", lambda: attach(model_path, hf_args("zero2_offload")))
        yield run("host_memory_skipped", with_extra(lambda: attach(model_path, hf_args("zero2_offload"),
                                                                   skip_checks=["host-memory"]), skipped))
    finally:
        psutil.virtual_memory = real


if __name__ == "__main__":
    main(scenarios, "attach_checks.json")
