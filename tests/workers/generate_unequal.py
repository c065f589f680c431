"""After a short ZeRO-3 training run on two ranks (parameters released after each use, so every forward gathers),
each rank generates from its own prompt with synced_gpus=False, rank 0 stopping after 2 new tokens and rank 1 after
6: the ranks finish at different lengths. Prints each rank's generated length, then FINISHED."""

import argparse
import json
import sys

import torch
from transformers import AutoModelForCausalLM, Trainer, default_data_collator

import deprecation_guard  # noqa: F401  (hf_zero calling a deprecated API fails the run)
import hf_zero


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--no-callback", action="store_true", help="a plain Trainer: what hf_zero guards against")
    opts = p.parse_args()

    hf_zero.init_distributed()
    config = hf_zero.load_config("zero3")
    config["zero_optimization"].update(stage3_param_persistence_threshold=0, stage3_max_live_parameters=0,
                                       stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0)
    args = hf_zero.TrainingArguments(output_dir=opts.out, deepspeed=config, per_device_train_batch_size=2, max_steps=1,
                                     report_to=[], save_strategy="no", disable_tqdm=True, seed=0)
    model = AutoModelForCausalLM.from_pretrained(opts.model, dtype=torch.float32)  # zero.Init: partitioned
    ids = torch.randint(3, 19, (8, 16), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row.clone()} for row in ids]
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator,
                      callbacks=[] if opts.no_callback else [hf_zero.ZeroCallback()])
    trainer.train()
    rank = torch.distributed.get_rank()
    prompt = ids[rank : rank + 1, : 4 + rank]  # prompts of different lengths, too
    new_tokens = 2 if rank == 0 else 6
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             synced_gpus=False, pad_token_id=0)
    sys.stdout.write("GENERATED " + json.dumps({"rank": rank, "new": out.shape[1] - prompt.shape[1]}) + "\n")
    sys.stdout.flush()
    hf_zero.shutdown(arrival_timeout_s=30)
    sys.stdout.write("hf_zero-test: worker finished\n")  # conftest.FINISHED


if __name__ == "__main__":
    main()
