"""A user's own Accelerate loop on one GPU: the 1.35B model at micro batch 32 and 65,536 tokens per optimizer step,
with zero2_offload's host step in the next forward (``hf_zero.prepare(..., offload_step_in_forward=True)``), with
DeepSpeed's step, or without DeepSpeed (torch's fused AdamW on the GPU). Appends one JSON line to --out.

    accelerate launch --config_file $(hf-zero presets zero2_offload --accelerate-config zero2_offload.yaml) \\
        --num_processes 1 benchmarks/1xH200/offload/accelerate_loop.py --setting in-forward --out loop.jsonl
    python benchmarks/1xH200/offload/accelerate_loop.py --setting plain --out loop.jsonl

tokens/s is the median over the timed optimizer steps (after --warmup of them; the first creates Adam's state, the
second finishes no held step), each step timed from one accumulation boundary to the next, the GPU synchronized.
"""

import argparse
import importlib.metadata
import json
import statistics
import time
from pathlib import Path

import torch
from accelerate.utils import DummyOptim
from transformers import AutoModelForCausalLM

import hf_zero
from hf_zero.model_configs import build_config, resolve_model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--setting", choices=["in-forward", "deepspeed-step", "plain"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="1.35b", help="a built-in model of python -m benchmarks.harness (tiny: a CPU smoke run)")
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--accumulation", type=int, default=2)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=2, help="optimizer steps before timing")
    opts = p.parse_args()
    on_gpu = torch.cuda.is_available()

    if opts.setting == "plain":
        from accelerate import Accelerator

        accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=opts.accumulation)
    else:
        accelerator = hf_zero.accelerator(mixed_precision="bf16", gradient_accumulation_steps=opts.accumulation)
    config = build_config(resolve_model(opts.model)[1])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(accelerator.device):
        model = AutoModelForCausalLM.from_config(config)
    optimizer_steps = opts.warmup + opts.steps
    ids = torch.randint(0, config.vocab_size, (opts.micro_batch * opts.accumulation * optimizer_steps, opts.seq))
    loader = torch.utils.data.DataLoader(ids, batch_size=opts.micro_batch)
    if opts.setting == "plain":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=on_gpu)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    else:
        optimizer = DummyOptim(model.parameters(), lr=1e-5)
        model, optimizer, loader = hf_zero.prepare(accelerator, model, optimizer, loader,
                                                   offload_step_in_forward=opts.setting == "in-forward")

    boundaries, losses = [], []
    model.train()
    for i, batch in enumerate(loader):
        with accelerator.accumulate(model):
            loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if (i + 1) % opts.accumulation == 0:
            if on_gpu:
                torch.cuda.synchronize()
            boundaries.append(time.perf_counter())
            losses.append(loss.item())
            accelerator.print(f"optimizer step {len(boundaries)}/{optimizer_steps}: loss {losses[-1]:.4f}", flush=True)
    hf_zero.finish_offload_step(model)
    step_s = [b - a for a, b in zip(boundaries[opts.warmup - 1:], boundaries[opts.warmup:])]
    tokens = opts.micro_batch * opts.accumulation * opts.seq
    held = getattr(getattr(model, "optimizer", None), "hf_zero_step_in_forward", None)
    row = {"setting": opts.setting, "micro_batch": opts.micro_batch, "accumulation": opts.accumulation,
           "tokens_per_step": tokens, "step_s": step_s, "tokens_per_s": tokens / statistics.median(step_s),
           "losses": losses, "step_in_forward": held is not None, "model": opts.model,
           "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None,
           "device": torch.cuda.get_device_name() if on_gpu else "cpu",
           "deepspeed": importlib.metadata.version("deepspeed") if opts.setting != "plain" else None}
    with Path(opts.out).open("a") as f:
        f.write(json.dumps(row) + "\n")
    accelerator.print(json.dumps({k: v for k, v in row.items() if k not in ("step_s", "losses")}))
    hf_zero.shutdown()


if __name__ == "__main__":
    main()
