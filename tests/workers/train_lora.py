"""A short LoRA fine-tune of a tiny model under DeepSpeed ZeRO-3 with the Trainer, as tests/test_lora.py launches it.

The base model is loaded after TrainingArguments (so zero.Init partitions it) and wrapped with
get_peft_model afterwards. Rank 0 writes result.json and the adapter tensors gathered from the
engine (expected_adapter.safetensors, named as in named_parameters) next to the saves:
  final/    trainer.save_model (the Trainer's own PEFT path)
  adapter/  hf_zero.lora.save_adapter
  naive/    model.save_pretrained, what many LoRA scripts do (--naive-save)
  merged/   hf_zero.lora.merge_and_save of adapter/ (--merge)
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_tiny import CHECKPOINTING_ARG, LoggedKeys, RandomTokens, StepsTrained, reentrant_kwargs

import deprecation_guard  # noqa: F401  (hf_zero calling a deprecated API fails the run)
import hf_zero
import hf_zero.lora


def deepspeed_config(opts):
    config = hf_zero.load_config(opts.deepspeed)
    if opts.persistence_threshold is not None:
        # The preset keeps tensors under 1e6 elements whole on every rank, so a tiny model's LoRA
        # tensors would never be partitions; 0 makes them partitions, as a 7B model's are.
        config["zero_optimization"]["stage3_param_persistence_threshold"] = opts.persistence_threshold
    return config


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--deepspeed", default="zero3")
    p.add_argument("--persistence-threshold", type=int, default=None)
    p.add_argument("--target-modules", default="q_proj,v_proj")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--save-steps", type=int, default=0)
    p.add_argument("--gc", action="store_true")
    p.add_argument("--leaves", action="store_true", help="the base's decoder layers as ZeRO-3 leaves (set_z3_leaf_modules)")
    p.add_argument("--reentrant", choices=["true", "false"], default=None, help="gradient_checkpointing_kwargs' use_reentrant")
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision (the base partitions in bf16)")
    p.add_argument("--naive-save", action="store_true")
    p.add_argument("--merge", action="store_true")
    p.add_argument("--resume", help="a checkpoint-N folder to resume from (through hf_zero.prepare_resume)")
    p.add_argument("--local_rank", type=int, default=None, help="set by the deepspeed launcher")
    opts = p.parse_args()

    from peft import LoraConfig, get_peft_model

    args = hf_zero.TrainingArguments(
        output_dir=opts.out, per_device_train_batch_size=2, max_steps=opts.steps, learning_rate=1e-2, logging_steps=1,
        report_to=[], seed=0, save_strategy="steps" if opts.save_steps else "no", save_steps=opts.save_steps or 500,
        disable_tqdm=True, lr_scheduler_type="constant", deepspeed=deepspeed_config(opts), bf16=opts.bf16,
        **{CHECKPOINTING_ARG: opts.gc}, **reentrant_kwargs(opts))
    base = AutoModelForCausalLM.from_pretrained(opts.model)  # zero.Init through TrainingArguments
    base_partitioned = hf_zero.is_partitioned(base)
    if opts.leaves:
        from deepspeed.utils import set_z3_leaf_modules

        set_z3_leaf_modules(base, [type(base.model.layers[0])])
    torch.manual_seed(0)  # LoRA A's init; rank 0's is broadcast when DeepSpeed partitions it
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=opts.target_modules.split(",")))
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens("causal", model.config.vocab_size))
    callback = hf_zero.attach(trainer)
    logged = LoggedKeys()
    trainer.add_callback(logged)
    steps_run = StepsTrained()
    trainer.add_callback(steps_run)
    trainer.train(resume_from_checkpoint=hf_zero.prepare_resume(trainer, opts.resume) if opts.resume else None)

    expected = hf_zero.lora.adapter_state_dict(trainer.model)  # gathered from the engine's partitions
    out = Path(opts.out)
    trainer.save_model(str(out / "final"))
    hf_zero.lora.save_adapter(trainer, out / "adapter")
    if opts.naive_save:
        # what many LoRA scripts do after training; no gather, so each tensor is this rank's partition
        trainer.model.save_pretrained(str(out / "naive"), is_main_process=trainer.is_world_process_zero())
    if trainer.is_world_process_zero():
        from safetensors.torch import save_file

        save_file(expected, str(out / "expected_adapter.safetensors"))
        if opts.merge:
            # Still inside the launched process group with the DeepSpeed config alive: a clean process merges.
            hf_zero.lora.merge_and_save(out / "adapter", opts.model, out / "merged")
        result = {
            "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
            "engine": type(trainer.model_wrapped).__name__,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "base_partitioned_at_load": base_partitioned,
            "partitioned_after_training": hf_zero.is_partitioned(trainer.model),
            "lora_numel_on_rank0": {n: p.numel() for n, p in trainer.model.named_parameters() if "lora_" in n},
            # the dtype the engine trains each adapter partition in
            "lora_dtypes": sorted({str(getattr(p, "ds_tensor", p).dtype) for n, p in trainer.model.named_parameters()
                                   if "lora_" in n}),
            "warnings": callback.warnings,
            "use_reentrant": (getattr(args, f"{CHECKPOINTING_ARG}_kwargs", None) or {}).get("use_reentrant"),
            # the same real args and model, as DeepSpeed 0.19.2 (CheckpointError reproduced there) would see them
            "checkpointing_problems_0_19_2": hf_zero.lora.peft_recompute_problems(trainer.model, args, "0.19.2"),
            "checkpoints": sorted(d.name for d in out.glob("checkpoint-*")),
            "steps_run": steps_run.steps,
        }
        (out / "result.json").write_text(json.dumps(result, indent=1))
    hf_zero.shutdown()
    print("hf_zero-test: worker finished", flush=True)  # conftest.FINISHED: all work done, only teardown left


if __name__ == "__main__":
    main()
