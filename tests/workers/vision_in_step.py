"""Tiny vision-language models trained by the Trainer under ZeRO-3 with ZeroCallback on two ranks whose batches hold
different modalities; several cases, one after another, in one process group.

A case is FAMILY:PRESET:SCHEDULE[:OPTION]. Schedules (the collator picks each rank's batch by its call count):
  mixed      rank 0: two images, then one image beside a text sample, in turn; rank 1: text only
  alternate  both ranks: images, then text, in turn
OPTION: a vision_in_step value ("keep", "per_step", "off"), or "bad_tower" (a config image size the vision tower
rejects, so the dummy cannot run).

Parameters are released after every use (persistence threshold, live and reuse limits 0), so each module's forward
gathers with a collective, and DeepSpeed prints each invalidation of its ZeRO-3 trace. Per case the worker prints
"CASE <case> START" and "CASE <case> END {json}" (or "CASE <case> DIVERGED <message>"); rank 1's END line carries the
loss of a text-only forward after training (rank 0 had an image in it) and the batch is saved for the test, rank 0
saves the model (OUT/<n>/final) and the engine's gathered weights (OUT/<n>/expected.safetensors)."""

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import Trainer

import deprecation_guard  # noqa: F401  (hf_zero calling a deprecated API fails the run)
import hf_zero
from tiny_vlm import build, collate, sample


def say(line: str) -> None:
    """One write per line: the workers run unbuffered, and print's separate newline interleaves with the other rank's."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def reset_accelerate():
    """Each case's Trainer builds its own Accelerator with its own DeepSpeed plugin."""
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()  # the process group itself stays up
    unset_hf_deepspeed_config()


class Scheduled:
    """A collator that ignores the sampled rows and builds this rank's next batch from the schedule."""

    def __init__(self, family, schedule, rank):
        self.family, self.schedule, self.rank, self.calls = family, schedule, rank, 0

    def images(self, call):
        if self.schedule == "alternate":
            return [call % 2 == 0] * 2
        return [self.rank == 0, self.rank == 0 and call % 2 == 0]

    def __call__(self, rows):
        call, self.calls = self.calls, self.calls + 1
        seed = 1000 * self.rank + 2 * call
        return collate([sample(self.family, image, seed + i) for i, image in enumerate(self.images(call))])


def run_case(case: str, index: int, out: Path, rank: int) -> None:
    family, preset, schedule, *rest = case.split(":")
    option = rest[0] if rest else "keep"
    folder = out / str(index)
    reset_accelerate()
    model = build(family)  # whole on every rank (before the arguments, whose live config would start zero.Init)
    if option == "bad_tower":
        model.config.vision_config.image_size = 7  # the dummy follows the config; CLIP takes only its own size
    config = hf_zero.load_config(preset)
    config["zero_optimization"].update(stage3_param_persistence_threshold=0, stage3_max_live_parameters=0,
                                       stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0,
                                       log_trace_cache_warnings=True)
    args = hf_zero.TrainingArguments(output_dir=str(folder), deepspeed=config, per_device_train_batch_size=2,
                                     max_steps=6, learning_rate=1e-3, report_to=[], save_strategy="no",
                                     logging_steps=1, disable_tqdm=True, seed=0, remove_unused_columns=False)
    callback = hf_zero.ZeroCallback(vision_in_step=option if option != "bad_tower" else "keep")
    trainer = Trainer(model=model, args=args, train_dataset=list(range(64)),
                      data_collator=Scheduled(family, schedule, rank), callbacks=[callback])
    say(f"CASE {case} START")
    try:
        trainer.train()
    except hf_zero.RanksDivergedError as e:
        say(f"CASE {case} DIVERGED {e}")
        torch.distributed.barrier()  # both ranks raised at the same check; the next case starts together
        return
    engine = trainer.model_wrapped
    step = getattr(trainer.model, "_hf_zero_vision_in_step", None)
    # after training: rank 0 with an image, rank 1 text only, in eval mode (the per-forward path)
    last = collate([sample(family, image=rank == 0, seed=7000 + rank)])
    engine.eval()
    with torch.no_grad():
        loss = engine(**last).loss
    result = {"rank": rank, "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
              "engine": type(engine).__name__, "dummy_passes": step.dummy_passes if step else None,
              "eval_loss_hex": float(loss).hex()}
    expected = hf_zero.gathered_state_dict(trainer.model)
    trainer.save_model(str(folder / "final"))
    if rank == 0:
        from safetensors.torch import save_file

        save_file(expected, str(folder / "expected.safetensors"))
    else:
        torch.save(last, folder / "text_batch.pt")
    say(f"CASE {case} END {json.dumps(result)}")
    engine.destroy()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cases", nargs="+", required=True)
    opts = p.parse_args()
    out = Path(opts.out)
    hf_zero.init_distributed()
    rank = torch.distributed.get_rank()
    for index, case in enumerate(opts.cases):
        run_case(case, index, out, rank)
    hf_zero.shutdown()
    print("hf_zero-test: worker finished", flush=True)  # conftest.FINISHED


if __name__ == "__main__":
    main()
