"""A few Trainer steps of a tiny Llama under an offload preset, one process, for hf_zero/engine/fixes.py's fixes.

``--preset`` picks the preset (zero2_offload by default); ``--params-on-gpu`` drops its ``offload_param``.
``--nan-step K`` turns every gradient of optimizer step K into NaN (a hook on the loss), as an fp16 overflow or a
bad batch would; ``--keep-syncs`` attaches ZeroCallback with overlap_offload_copies=False (DeepSpeed as shipped).
``--chunked-step N`` runs the ZeRO-1/2 offload step in chunks of N elements at train begin (the fix's gate
leaves host-memory 16-bit partitions alone, so on a machine without a GPU it is forced here), ``--in-forward`` in
the next forward; the ZeRO-1/2 weights are then read from the parameters (not a state_dict, which would finish a
held step itself), so they show that ZeroCallback finished the last step at train end. ``--pinned-copy`` puts the
ZeRO-3 pinned update copy on every host-stepped sub-group at train begin: on a machine without a GPU the 16-bit
partitions are in host memory too, where the fix itself stays out.
Writes result.json (losses, grad norms, whether each fix was applied) and the final 16-bit weights
(weights.safetensors, gathered under ZeRO-3).
"""

import argparse
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Trainer, TrainerCallback

import deprecation_guard  # noqa: F401  (hf_zero calling a deprecated API fails the run)
import hf_zero
from train_tiny import RandomTokens


class PinnedCopyEverywhere(TrainerCallback):
    """At train begin (the engine is built), routes every host-stepped ZeRO-3 sub-group through the pinned copy."""

    def __init__(self):
        self.trainer, self.sub_groups = None, []

    def on_train_begin(self, args, state, control, **kwargs):
        from hf_zero.engine.fixes import copy_updates_through_pinned_memory

        optimizer = self.trainer.model_wrapped.optimizer
        self.sub_groups = [i for i, master in enumerate(optimizer.fp32_partitioned_groups_flat)
                           if master.device.type == "cpu"]
        copy_updates_through_pinned_memory(optimizer, self.sub_groups)


class ChunkedStepEverywhere(TrainerCallback):
    """At train begin, runs the ZeRO-1/2 offload step of every parameter group in chunks of ``chunk`` elements,
    with ``in_forward`` in the next forward."""

    def __init__(self, chunk: int, in_forward: bool):
        self.trainer, self.chunk, self.in_forward = None, chunk, in_forward

    def on_train_begin(self, args, state, control, **kwargs):
        from hf_zero.engine.offload_step import step_offloaded_groups_in_chunks

        engine = self.trainer.model_wrapped
        engine.optimizer.hf_zero_step_in_forward = step_offloaded_groups_in_chunks(
            engine.optimizer, self.chunk, engine.module if self.in_forward else None)


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
    p.add_argument("--preset", default="zero2_offload")
    p.add_argument("--params-on-gpu", action="store_true")
    p.add_argument("--pinned-copy", action="store_true")
    p.add_argument("--chunked-step", type=int, default=0)
    p.add_argument("--in-forward", action="store_true")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    opts = p.parse_args()

    config = json.loads(hf_zero.preset_path(opts.preset).read_text())
    if opts.params_on_gpu:
        del config["zero_optimization"]["offload_param"]
    args = hf_zero.TrainingArguments(output_dir=opts.out, deepspeed=config, per_device_train_batch_size=2,
                                     gradient_accumulation_steps=opts.accum, max_steps=opts.steps, learning_rate=1e-3,
                                     logging_steps=1, report_to=[], seed=0, save_strategy="no", disable_tqdm=True,
                                     lr_scheduler_type="constant", max_grad_norm=opts.max_grad_norm,
                                     bf16=opts.bf16)
    model = AutoModelForCausalLM.from_pretrained(opts.model)
    nan_at = NanGradientsAt(opts.nan_step)

    class NanTrainer(Trainer):
        def compute_loss(self, model, inputs, *a, **kw):
            loss = super().compute_loss(model, inputs, *a, **kw)
            return loss * float("nan") if nan_at.current == nan_at.step else loss

    pinned, chunked = PinnedCopyEverywhere(), ChunkedStepEverywhere(opts.chunked_step, opts.in_forward)
    trainer = NanTrainer(model=model, args=args, train_dataset=RandomTokens("causal", model.config.vocab_size),
                         callbacks=[nan_at] + ([pinned] if opts.pinned_copy else [])
                         + ([chunked] if opts.chunked_step else []))
    pinned.trainer = chunked.trainer = trainer
    callback = hf_zero.attach(trainer, log_memory=False, overlap_offload_copies=not opts.keep_syncs)
    trainer.train()
    engine = trainer.model_wrapped
    # the instance attributes the fixes set
    fixed = "update_offload_overflow_tracker" in vars(engine.optimizer)
    pinned_copy = "_reassign_or_swap_out_partitioned_parameters" in vars(engine.optimizer)
    chunked_step = "_optimizer_step" in vars(engine.optimizer)
    in_forward = getattr(engine.optimizer, "hf_zero_step_in_forward", None) is not None
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    if engine.zero_optimization_stage() == 3:
        weights = engine._zero3_consolidated_16bit_state_dict()
    else:
        weights = dict(trainer.model.named_parameters())
    weights = {k: v.detach().clone().contiguous() for k, v in weights.items()}
    save_file(weights, str(Path(opts.out) / "weights.safetensors"))
    result = {"fixed": fixed, "pinned_copy": pinned_copy, "chunked_step": chunked_step, "in_forward": in_forward,
              "pinned_sub_groups": pinned.sub_groups,
              "losses": [e["loss"] for e in logs],
              "grad_norms": [None if e.get("grad_norm") is None or math.isnan(e["grad_norm"]) else e["grad_norm"]
                             for e in logs], "steps": trainer.state.global_step,
              "threads": torch.get_num_threads(), "warnings": callback.warnings}
    (Path(opts.out) / "result.json").write_text(json.dumps(result))
    hf_zero.shutdown()


if __name__ == "__main__":
    main()
