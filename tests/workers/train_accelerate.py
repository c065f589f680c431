"""A user's own Accelerate loop with hf_zero, launched with a preset's Accelerate YAML:

    accelerate launch --config_file $(hf-zero presets zero3 --accelerate-config zero3.yaml) \
        tests/workers/train_accelerate.py --model M --out O

Rank 0 writes result.json and the engine's gathered weights (expected.safetensors) next to the saved model.
"""

import argparse
import json
import os
from pathlib import Path

import torch
from accelerate.utils import DummyOptim
from transformers import AutoModelForCausalLM

import deprecation_guard  # noqa: F401  (hf_zero calling a deprecated API fails the run)
import hf_zero


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--optimizer", choices=["dummy", "torch"], default="dummy")
    p.add_argument("--save-on-main-only", action="store_true", help="the classic mistake: save under is_main_process")
    p.add_argument("--uneven", action="store_true",
                   help="even_batches=False and one batch more on rank 0; the loop runs over all of its loader")
    p.add_argument("--arrival-timeout", type=float, default=None, help="hf_zero.save_pretrained's arrival_timeout_s")
    p.add_argument("--length", type=int, default=16, help="tokens per sample")
    p.add_argument("--long-context", action="store_true", help="hf_zero.enable_long_context + gradient checkpointing")
    p.add_argument("--plain-accelerator", action="store_true", help="accelerate.Accelerator() instead of hf_zero's")
    p.add_argument("--offload-step-in-forward", type=int, default=0, metavar="CHUNK",
                   help="hf_zero.prepare(offload_step_in_forward=True, offload_step_chunk=CHUNK)")
    opts = p.parse_args()

    if opts.plain_accelerator:
        from accelerate import Accelerator

        accelerator = Accelerator()
    elif opts.uneven:
        from accelerate.utils import DataLoaderConfiguration

        accelerator = hf_zero.accelerator(dataloader_config=DataLoaderConfiguration(even_batches=False))
    else:
        accelerator = hf_zero.accelerator()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(opts.model, dtype=torch.float32)  # zero.Init under the zero3 YAML
    partitioned_at_load = hf_zero.is_partitioned(model)
    g = torch.Generator().manual_seed(0)
    # a few sequences seen again and again, so a few steps visibly lower the loss
    ids = torch.randint(3, model.config.vocab_size, (4, opts.length), generator=g).repeat(opts.steps * accelerator.num_processes, 1)
    if opts.long_context:  # what docs/long-context.md tells a loop to write
        hf_zero.enable_long_context(model)
        model.gradient_checkpointing_enable()
    if opts.uneven:  # 2 samples a batch, 5 batches: rank 0 gets 3 of them, rank 1 gets 2
        ids = ids[:9]
    loader = torch.utils.data.DataLoader([{"input_ids": i, "labels": i.clone()} for i in ids], batch_size=2)
    if opts.optimizer == "dummy":
        optimizer = DummyOptim(model.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-6)
    if opts.offload_step_in_forward and not torch.cuda.is_available():
        # the fix leaves CPU-only runs to DeepSpeed's step (no GPU work to hide it behind); here it is what is tested
        from hf_zero.engine import fixes as engine_fixes

        engine_fixes._sixteen_bit_partitions_on_accelerator = lambda optimizer: True
    in_forward = {"offload_step_in_forward": True, "offload_step_chunk": opts.offload_step_in_forward} \
        if opts.offload_step_in_forward else {}
    model, optimizer, loader = hf_zero.prepare(accelerator, model, optimizer, loader, **in_forward)
    losses = []
    model.train()
    for step, batch in enumerate(loader):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
        if step + 1 == opts.steps and not opts.uneven:
            break

    held = getattr(model.optimizer, "hf_zero_step_in_forward", None)
    step_held_at_end = bool(held and held.pending)  # the last step waits for a forward or a state_dict
    out = Path(opts.out)
    # a collective: every rank enters (an uneven loop goes straight to the save, as a user's does)
    expected = None if opts.uneven else hf_zero.gathered_state_dict(accelerator.unwrap_model(model))
    if opts.save_on_main_only:
        if accelerator.is_main_process:
            hf_zero.save_pretrained(accelerator, model, out / "final", arrival_timeout_s=10)
    else:
        timeout = {"arrival_timeout_s": opts.arrival_timeout} if opts.arrival_timeout else {}
        hf_zero.save_pretrained(accelerator, model, out / "final", **timeout)
    if accelerator.is_main_process:
        from safetensors.torch import save_file

        save_file(expected, str(out / "expected.safetensors"))
        basic = model.optimizer.optimizer  # the torch optimizer inside DeepSpeed's ZeRO optimizer
        result = {"losses": losses, "engine": type(model).__name__, "dp_world_size": model.dp_world_size,
                  "partitioned_at_load": partitioned_at_load, "optimizer": type(basic).__name__,
                  "betas": list(basic.param_groups[0]["betas"]), "eps": basic.param_groups[0]["eps"],
                  "world_size": int(os.environ.get("WORLD_SIZE", "1")),
                  "long_context": str(hf_zero.long_context.long_context_of(model)),
                  "checkpointing": accelerator.unwrap_model(model).is_gradient_checkpointing,
                  "step_in_forward": held is not None, "step_held_at_end": step_held_at_end,
                  "checks_ran": [list(entry) for entry in hf_zero.accelerate.run_of(accelerator).ran],
                  # the instance attributes hf_zero.engine.fixes sets on the ZeRO optimizer
                  "engine_fixes": sorted(name for name in ("update_offload_overflow_tracker",
                                                           "_reassign_or_swap_out_partitioned_parameters")
                                         if name in vars(model.optimizer))}
        (out / "result.json").write_text(json.dumps(result, indent=1))
    accelerator.wait_for_everyone()
    hf_zero.shutdown()
    print("hf_zero-test: worker finished", flush=True)


if __name__ == "__main__":
    main()
