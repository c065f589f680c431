"""A short Trainer run of the tiny Llama with Ulysses sequence parallelism (or without, for the reference).

--sp N > 1 passes TrainingArguments(parallelism_config=ParallelismConfig(sp_backend="deepspeed", sp_size=N));
--sp 0 passes none (the Accelerate YAML's parallelism_config block supplies it); --sp 1 is the plain run. Every
rank writes rank<R>.json with the token shard its model saw each step; rank 0 writes result.json, the gradients
DeepSpeed held before the first optimizer step (grads.safetensors) and the trained weights (expected.safetensors).
"""

import argparse
import json
import os
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, Trainer

import deprecation_guard  # noqa: F401  (hf_zero calling a deprecated API fails the run)
import hf_zero


class Tokens(torch.utils.data.Dataset):
    """Rows of 16 tokens from 16 distinct ids, no position_ids (hf_zero adds them for the SP dataloader)."""

    def __init__(self, n=16, length=16):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(3, 19, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


class FirstStepGrads(transformers.TrainerCallback):
    """The full gradients DeepSpeed holds when its first optimizer step starts (read through engine.step: the
    Trainer's backward under DeepSpeed runs the step itself, so no Trainer event sits between the two)."""

    def __init__(self, trainer):
        self.trainer, self.grads = trainer, None

    def on_train_begin(self, args, state, control, **kwargs):
        from deepspeed.utils import safe_get_full_grad

        engine = self.trainer.model_wrapped
        step = engine.step

        def step_reading_grads(*a, **k):
            if self.grads is None:  # every rank calls it: the full gradient is gathered from the shards
                self.grads = {n: safe_get_full_grad(p).detach().clone() for n, p in engine.module.named_parameters()}
            return step(*a, **k)

        engine.step = step_reading_grads


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sp", type=int, default=1)
    p.add_argument("--deepspeed", default="zero3")
    p.add_argument("--steps", type=int, default=3)
    opts = p.parse_args()

    parallelism = None
    if opts.sp > 1:
        from accelerate.parallelism_config import ParallelismConfig
        from accelerate.utils import DeepSpeedSequenceParallelConfig

        parallelism = ParallelismConfig(sp_backend="deepspeed", sp_size=opts.sp,
                                        sp_handler=DeepSpeedSequenceParallelConfig(sp_attn_implementation="sdpa"))
    args = hf_zero.TrainingArguments(
        output_dir=opts.out, per_device_train_batch_size=2, max_steps=opts.steps, learning_rate=1e-3,
        lr_scheduler_type="constant", logging_steps=1, report_to=[], seed=0, save_strategy="no", disable_tqdm=True,
        deepspeed=opts.deepspeed if opts.deepspeed != "none" else None, parallelism_config=parallelism,
        # batches in dataset order: the SP run's step i and the plain run's step i then train on the same rows
        train_sampling_strategy="sequential")
    model = AutoModelForCausalLM.from_pretrained(opts.model, dtype=torch.float32, attn_implementation="sdpa")

    seen = []
    model.register_forward_pre_hook(
        lambda module, a, kw: seen.append({k: kw[k].tolist() for k in ("input_ids", "position_ids") if k in kw}),
        with_kwargs=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens())
    hf_zero.attach(trainer)
    grads = FirstStepGrads(trainer)
    trainer.add_callback(grads)
    trainer.train()

    rank = int(os.environ.get("RANK", "0"))
    (Path(opts.out) / f"rank{rank}.json").write_text(json.dumps(seen))
    expected = hf_zero.gathered_state_dict(trainer.model)
    if trainer.is_world_process_zero():
        from safetensors.torch import save_file

        save_file(expected, str(Path(opts.out) / "expected.safetensors"))
        save_file(grads.grads, str(Path(opts.out) / "grads.safetensors"))
        engine = trainer.model_wrapped
        result = {
            "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
            "engine": type(engine).__name__,
            "sequence_parallel_size": getattr(engine, "sequence_parallel_size", None),
            "seq_dp_world_size": getattr(engine, "seq_dp_world_size", None),
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "train_batch_size": engine.train_batch_size(),
        }
        (Path(opts.out) / "result.json").write_text(json.dumps(result, indent=2))
    hf_zero.shutdown()
    print("hf_zero-test: worker finished", flush=True)


if __name__ == "__main__":
    main()
