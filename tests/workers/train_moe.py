"""Tiny mixture-of-experts models trained one after another in one process group by the Trainer under ZeRO-3 with
ZeroCallback, their parameters released after each use (so every module's forward gathers them with a collective),
with routing that differs per rank: rank 0 sees one repeated token (every token goes to the same experts), rank 1
random tokens (most experts). ``--loop`` trains one case in a user's own Accelerate loop instead (hf_zero.prepare).

Each case saves a checkpoint (ZeroCallback checks it reloads) and rank 0 writes the engine's gathered weights to
OUT/CASE/expected.safetensors. Rank by rank it prints "CASE {json}" per case (the ZeRO-3 leaves the model had, the
losses, seconds), then FINISHED."""

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Trainer, default_data_collator

import deprecation_guard  # noqa: F401  (hf_zero calling a deprecated API fails the run)
import hf_zero
from hf_zero.zero3 import gathered_state_dict, release_zero3_config
from moe_models import VOCAB, build

STEPS = 2


def say(line: str) -> None:
    """One write per line: the workers run unbuffered, and print's separate newline interleaves with the other rank's."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def rank_data(rank: int, n: int = 16, length: int = 8) -> list:
    g = torch.Generator().manual_seed(rank)
    if rank == 0:
        ids = torch.full((n, length), 5)
    else:
        ids = torch.randint(3, VOCAB, (n, length), generator=g)
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def leaves(model) -> list:
    from deepspeed.utils import z3_leaf_module

    return [type(m).__name__ for m in model.modules() if z3_leaf_module(m)]


def release_after_use(config: dict) -> dict:
    """Parameters released after every use: each module's forward really gathers its parameters."""
    config["zero_optimization"].update(stage3_param_persistence_threshold=0, stage3_max_live_parameters=0,
                                       stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0,
                                       stage3_module_granularity_threshold=0)
    return config


def train(case: str, out: Path, moe_leaves: str, rank: int, block_leaves: str) -> dict:
    config = release_after_use(hf_zero.load_config("zero3"))
    args = hf_zero.TrainingArguments(output_dir=str(out), deepspeed=config, per_device_train_batch_size=2,
                                     max_steps=STEPS, learning_rate=1e-3, report_to=[], save_strategy="steps",
                                     save_steps=STEPS, logging_steps=1, disable_tqdm=True, seed=0)
    torch.manual_seed(0)
    model = build(case)  # partitioned by zero.Init: the arguments above keep a stage-3 config alive
    trainer = Trainer(model=model, args=args, train_dataset=rank_data(rank), data_collator=default_data_collator,
                      callbacks=[hf_zero.ZeroCallback(moe_leaves=moe_leaves, leaves=block_leaves)])
    started = time.monotonic()
    trainer.train()
    state = gathered_state_dict(model)  # a collective: every rank
    if rank == 0:
        save_file({k: v.contiguous() for k, v in state.items()}, str(out / "expected.safetensors"))
    losses = [round(e["loss"], 4) for e in trainer.state.log_history if "loss" in e]
    result = {"case": case, "rank": rank, "leaves": leaves(model), "losses": losses,
              "seconds": round(time.monotonic() - started, 1)}
    # the next case builds its own engine and config
    trainer.model_wrapped.destroy()
    del trainer, model
    release_zero3_config()
    gc.collect()
    return result


def train_loop(accelerator, case: str, out: Path, moe_leaves: str, rank: int, block_leaves: str) -> dict:
    """The same in a user's own Accelerate loop (hf_zero.prepare), saved with hf_zero.save_pretrained."""
    from accelerate.utils import DummyOptim

    torch.manual_seed(0)
    model = build(case)  # partitioned by zero.Init: the Accelerator's DeepSpeed plugin keeps a stage-3 config alive
    loader = torch.utils.data.DataLoader(rank_data(rank), batch_size=2)
    optimizer = DummyOptim(model.parameters(), lr=1e-3)
    started = time.monotonic()
    engine, optimizer, loader = hf_zero.prepare(accelerator, model, optimizer, loader, moe_leaves=moe_leaves,
                                                leaves=block_leaves)
    losses = []
    for step, batch in zip(range(STEPS), loader):
        loss = engine(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(round(accelerator.reduce(loss.detach(), reduction="mean").item(), 4))
    state = gathered_state_dict(model)  # a collective: every rank
    hf_zero.save_pretrained(accelerator, engine, out / f"checkpoint-{STEPS}")
    if rank == 0:
        save_file({k: v.contiguous() for k, v in state.items()}, str(out / "expected.safetensors"))
    return {"case": case, "rank": rank, "leaves": leaves(model), "losses": losses,
            "seconds": round(time.monotonic() - started, 1)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cases", required=True, help="comma-separated: ARCH:IMPL (fused) or modulelist")
    p.add_argument("--moe-leaves", default="auto")
    # off by default here: these runs test moe-leaves, and a decoder layer made a leaf holds its MoE block whole
    p.add_argument("--leaves", default="off", help="hf_zero's block leaves: auto, off")
    p.add_argument("--loop", action="store_true", help="an Accelerate loop (one case; launch with accelerate)")
    opts = p.parse_args()

    if opts.loop:
        accelerator = hf_zero.accelerator()
        release_after_use(accelerator.state.deepspeed_plugin.deepspeed_config)  # the live config prepare builds from
        [case] = opts.cases.split(",")
        rank = torch.distributed.get_rank()
        result = train_loop(accelerator, case, Path(opts.out) / case.replace(":", "-"), opts.moe_leaves, rank,
                            opts.leaves)
        say("CASE " + json.dumps(result))
    else:
        hf_zero.init_distributed()
        rank = torch.distributed.get_rank()
        for case in opts.cases.split(","):
            out = Path(opts.out) / case.replace(":", "-")
            say("CASE " + json.dumps(train(case, out, opts.moe_leaves, rank, opts.leaves)))
    hf_zero.shutdown()
    print("hf_zero-test: worker finished", flush=True)  # conftest.FINISHED


if __name__ == "__main__":
    main()
