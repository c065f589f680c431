"""A tiny model whose forward takes a branch on rank 0 only, trained by the Trainer under ZeRO-3 with ZeroCallback on
two ranks, its parameters released after each use (so every module's forward gathers them with a collective); with
``--door loop``, trained by a plain Accelerate loop through hf_zero.prepare instead.

Rank by rank it prints what ended the run: "diverged after S s: MESSAGE", or how many checks ZeroCallback's
divergence watch ran and whether its hooks were still on at the end, then FINISHED."""

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from transformers import Trainer, default_data_collator

import deprecation_guard  # noqa: F401  (hf_zero calling a deprecated API fails the run)
import hf_zero

VOCAB = 32


class Branchy(torch.nn.Module):
    """Embedding, a linear layer only rank 0 runs (from step ``diverge_at`` on), a shared layer, a head."""

    def __init__(self, diverge_at, case="branch"):
        super().__init__()
        self.case = case
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.rank_zero_only = torch.nn.Linear(16, 16)
        self.shared = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, VOCAB)
        self.diverge_at = diverge_at
        self.engine = []  # a list, so the engine is not registered as a submodule

    def forward(self, input_ids, labels=None):
        hidden = self.embed(input_ids)
        step = self.engine[0].global_steps if self.engine else 0
        if self.diverge_at is not None and step >= self.diverge_at and torch.distributed.get_rank() == 0:
            if self.case == "read-param":  # no module call: DeepSpeed gathers the weight on the read, on rank 0 only
                hidden = F.linear(hidden, self.rank_zero_only.weight, self.rank_zero_only.bias)
            elif self.case == "branch":
                hidden = self.rank_zero_only(hidden)
        logits = self.head(self.shared(hidden))
        return {"loss": F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1)), "logits": logits}


def say(line: str) -> None:
    """One write per line: the workers run unbuffered, and print's separate newline interleaves with the other rank's."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def generate_like(engine, inputs) -> None:
    """What generate does to a ZeRO-3 model (a few forwards without gradients) on rank 0 only."""
    with torch.no_grad():
        for _ in range(3):
            engine.module(inputs["input_ids"], inputs["labels"])


class EngineAware(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        self.model.engine[:] = [self.model_wrapped]  # the model reads the engine's step to decide its branch
        if (self.model.case == "generate" and self.model_wrapped.global_steps == self.model.diverge_at
                and torch.distributed.get_rank() == 0):
            generate_like(self.model_wrapped, inputs)
        return super().training_step(model, inputs, num_items_in_batch)


def train_loop(opts, config, data):
    """Accelerate's own loop (a torch AdamW, accelerator.backward, optimizer.step) with hf_zero.prepare."""
    from accelerate.utils import DeepSpeedPlugin
    from torch.utils.data import DataLoader

    config["train_micro_batch_size_per_gpu"] = 2
    accelerator = hf_zero.accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    model = Branchy(opts.diverge_at, opts.case)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=2, collate_fn=default_data_collator)
    engine, optimizer, loader = hf_zero.prepare(accelerator, model, optimizer, loader, **checked(opts))
    model.engine[:] = [engine]
    rank = torch.distributed.get_rank()
    started = time.monotonic()
    try:
        for _, batch in zip(range(opts.steps), loader):
            accelerator.backward(engine(**batch)["loss"])
            optimizer.step()
            optimizer.zero_grad()
    except hf_zero.RanksDivergedError as e:
        diverged(rank, started, e, opts.case == "branch")
    say("WATCH " + json.dumps({"rank": rank, "steps": int(engine.global_steps)}))
    hf_zero.shutdown()
    print("hf_zero-test: worker finished", flush=True)  # conftest.FINISHED


def checked(opts) -> dict:
    return {} if opts.check is None else {"divergence_check": opts.check}


def diverged(rank, started, error, together: bool):
    """Print what stopped this rank. ``together``: every rank raised at the same check, so each waits for the others
    to print before exiting (the launcher stops the other ranks as soon as one fails); a rank stopped while another
    sits in one of DeepSpeed's collectives cannot meet it there, and hf_zero has had it print its side already."""
    say(f"rank {rank} diverged after {time.monotonic() - started:.1f} s: {error}")
    if together:
        torch.distributed.barrier()
    raise SystemExit(3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--diverge-at", type=int, default=None, help="rank 0 takes its own branch from this step on")
    p.add_argument("--check", default=None, help="divergence_check (hf_zero's default when not given)")
    p.add_argument("--case", default="branch", choices=["branch", "read-param", "generate"],
                   help="what rank 0 does from --diverge-at on: run a module the others do not, read a parameter "
                        "directly, or run a generate-like loop of forwards (at that step only)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--door", default="trainer", choices=["trainer", "loop"])
    opts = p.parse_args()

    hf_zero.init_distributed()
    config = hf_zero.load_config("zero3")
    # released after every use: each module's forward really gathers its parameters
    config["zero_optimization"].update(stage3_param_persistence_threshold=0, stage3_max_live_parameters=0,
                                       stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0)
    torch.manual_seed(0)
    data = [{"input_ids": torch.randint(0, VOCAB, (8,)), "labels": torch.randint(0, VOCAB, (8,))} for _ in range(64)]
    if opts.door == "loop":
        return train_loop(opts, config, data)
    args = hf_zero.TrainingArguments(output_dir=opts.out, deepspeed=config, per_device_train_batch_size=2,
                                     max_steps=opts.steps, learning_rate=1e-3, report_to=[], save_strategy="no",
                                     logging_steps=1, disable_tqdm=True, seed=0)
    callback = hf_zero.ZeroCallback(**checked(opts))
    trainer = EngineAware(model=Branchy(opts.diverge_at, opts.case), args=args, train_dataset=data,
                          data_collator=default_data_collator, callbacks=[callback])
    rank = torch.distributed.get_rank()
    started = time.monotonic()
    try:
        trainer.train()
    except hf_zero.RanksDivergedError as e:
        diverged(rank, started, e, opts.case == "branch")
    watch = callback._fetch_watch
    say("WATCH " + json.dumps({"rank": rank, "checks": watch.checks if watch else None,
                               "fingerprints": watch.fingerprints if watch else None,
                               "hooks_left": len(watch.handles) if watch else None}))
    hf_zero.shutdown()
    print("hf_zero-test: worker finished", flush=True)  # conftest.FINISHED


if __name__ == "__main__":
    main()
