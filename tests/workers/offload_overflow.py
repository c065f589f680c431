"""A few Trainer steps of a tiny Llama under the zero2_offload preset, one process, for the overflow-sync fix.

``--nan-step K`` turns every gradient of optimizer step K into NaN (a hook on the loss), as an fp16 overflow or a
bad batch would; ``--keep-syncs`` attaches ZeroCallback with overlap_offload_copies=False (DeepSpeed as shipped).
Writes result.json (losses, grad norms, whether the fix was applied) and the final weights (weights.safetensors).
"""

import argparse
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Trainer, TrainerCallback

import hf_zero
from train_tiny import RandomTokens


class NanGradientsAt(TrainerCallback):
    """Makes the loss of every micro-batch of optimizer step ``step`` (1-based) NaN, so all its gradients are."""

    def __init__(self, step: int | None):
        self.step, self.current = step, 0

    def on_step_begin(self, args, state, control, **kwargs):
        self.current = state.global_step + 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--nan-step", type=int, default=None)
    p.add_argument("--keep-syncs", action="store_true")
    p.add_argument("--bf16", action="store_true")
    opts = p.parse_args()

    args = hf_zero.TrainingArguments(output_dir=opts.out, deepspeed="zero2_offload", per_device_train_batch_size=2,
                                     gradient_accumulation_steps=opts.accum, max_steps=opts.steps, learning_rate=1e-3,
                                     logging_steps=1, report_to=[], seed=0, save_strategy="no", disable_tqdm=True,
                                     lr_scheduler_type="constant", max_grad_norm=1.0,
                                     bf16=opts.bf16)
    model = AutoModelForCausalLM.from_pretrained(opts.model)
    nan_at = NanGradientsAt(opts.nan_step)

    class NanTrainer(Trainer):
        def compute_loss(self, model, inputs, *a, **kw):
            loss = super().compute_loss(model, inputs, *a, **kw)
            return loss * float("nan") if nan_at.current == nan_at.step else loss

    trainer = NanTrainer(model=model, args=args, train_dataset=RandomTokens("causal", model.config.vocab_size),
                         callbacks=[nan_at])
    callback = hf_zero.attach(trainer, log_memory=False, overlap_offload_copies=not opts.keep_syncs)
    trainer.train()
    optimizer = trainer.model_wrapped.optimizer
    fixed = "update_offload_overflow_tracker" in vars(optimizer)  # the instance attribute the fix sets
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    weights = {k: v.detach().clone().contiguous() for k, v in trainer.model.state_dict().items()}
    save_file(weights, str(Path(opts.out) / "weights.safetensors"))
    result = {"fixed": fixed, "losses": [e["loss"] for e in logs],
              "grad_norms": [None if e.get("grad_norm") is None or math.isnan(e["grad_norm"]) else e["grad_norm"]
                             for e in logs], "steps": trainer.state.global_step,
              "threads": torch.get_num_threads(), "warnings": callback.warnings}
    (Path(opts.out) / "result.json").write_text(json.dumps(result))
    hf_zero.shutdown()


if __name__ == "__main__":
    main()
