"""What ZeroCallback's divergence check (hf_zero/zero3/divergence.py) costs a ZeRO-3 training step, on one GPU.

One GPU is one rank, where the check has nothing to compare and does not run; so the cost is measured in two parts,
both on the machine that runs this:
  1. the hooks: a ZeRO-3 engine (the bench's Llama-like 1.35B, bf16, micro batch 4, sequence 1024, the zero3 preset's
     buckets) trains with and without a FetchOrderWatch whose exchange runs over a one-rank gloo group: every hook,
     tensor and call of the check, with the exchange itself local;
  2. the exchange: two processes on this host's CPUs time the check's all_gather (three int64 over gloo).
A two-rank run pays per step about (1) + checks_per_step x (2) in its first steps (every module checked), and
(1') + fingerprints_per_step x (2) after them (divergence_check="whole_run": one exchange at each forward's start and
end, (1') timed as (1) with only those). The three ways run interleaved, ``--rounds`` times ``--steps`` steps each; a
way's cost is the median over rounds of its difference to the same round's steps without the check.

    python benchmarks/1xH200/divergence/measure.py --out divergence.json   # one GPU; with the device's env lines
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def exchange_latency(rank, port, repeats, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mine = torch.tensor([7, 0, 0], dtype=torch.int64)
    gathered = [torch.empty_like(mine) for _ in range(2)]
    for _ in range(200):
        dist.all_gather(gathered, mine)
    started = time.perf_counter()
    for _ in range(repeats):
        dist.all_gather(gathered, mine)
        gathered[0].tolist()
    if rank == 0:
        queue.put((time.perf_counter() - started) / repeats)
    dist.destroy_process_group()


def timed_steps(engine, batch, steps):
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        started = time.perf_counter()
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)
        engine.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return times


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=6, help="timed steps of each way in a round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--warmup", type=int, default=3)
    opts = p.parse_args()

    queue = mp.get_context("spawn").Queue()
    mp.spawn(exchange_latency, args=(29517, 5000, queue), nprocs=2, join=True)
    exchange_s = queue.get()

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29518")
    import deepspeed
    from transformers import AutoModelForCausalLM

    import hf_zero
    from hf_zero.model_configs import build_config, resolve_model
    from hf_zero.zero3.divergence import FetchOrderWatch

    deepspeed.init_distributed()
    config = hf_zero.load_config("zero3")
    config.update(train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=1, train_batch_size=4,
                  bf16={"enabled": True}, optimizer={"type": "AdamW", "params": {"lr": 1e-5}})
    config.pop("fp16", None)
    for key in ("gradient_clipping",):
        config[key] = 1.0
    _, model_dict = resolve_model("1.35b")
    model = AutoModelForCausalLM.from_config(build_config(model_dict), dtype=torch.bfloat16)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    batch = torch.randint(0, 32000, (4, 1024), device="cuda")

    timed_steps(engine, batch, opts.warmup)
    group = dist.new_group(backend="gloo")
    # the three ways interleaved, round after round: this step's time drifts by tens of ms over a minute on a shared
    # host, more than the cost being measured; a difference is taken within each round, then the median over rounds
    samples = {"without": [], "with": [], "with_fingerprints": []}
    per_round = {"with": [], "with_fingerprints": []}
    checks_per_step = fingerprints_per_step = 0.0
    for _ in range(opts.rounds):
        plain = timed_steps(engine, batch, opts.steps)
        watch = FetchOrderWatch(engine, group, 1, steps=None)
        timed_steps(engine, batch, 1)
        checks_before = watch.checks
        watched = timed_steps(engine, batch, opts.steps)
        checks_per_step = (watch.checks - checks_before) / opts.steps
        watch.remove()
        # the whole-run mode after its first steps: one exchange at each forward's start and end (a fingerprint)
        fingerprint = FetchOrderWatch(engine, group, 1, steps=0, afterwards="fingerprint")
        timed_steps(engine, batch, 1)
        fingerprints_before = fingerprint.fingerprints
        fingerprinted = timed_steps(engine, batch, opts.steps)
        fingerprints_per_step = (fingerprint.fingerprints - fingerprints_before) / opts.steps
        fingerprint.remove()
        for name, times in (("without", plain), ("with", watched), ("with_fingerprints", fingerprinted)):
            samples[name] += times
        base = statistics.median(plain)
        per_round["with"].append(statistics.median(watched) - base)
        per_round["with_fingerprints"].append(statistics.median(fingerprinted) - base)

    plain_ms = statistics.median(samples["without"]) * 1e3
    hooks_ms = statistics.median(per_round["with"]) * 1e3
    fingerprint_ms = statistics.median(per_round["with_fingerprints"]) * 1e3
    result = {
        "model": "1.35b", "micro_batch": 4, "seq": 1024, "preset": "zero3", "gpu": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__},
        "command": "python benchmarks/1xH200/divergence/measure.py " + " ".join(sys.argv[1:]),
        "step_ms_without_check": round(plain_ms, 2),
        "step_ms_with_check_one_rank": round(statistics.median(samples["with"]) * 1e3, 2),
        "hooks_ms_per_step": round(hooks_ms, 2), "checks_per_step": checks_per_step,
        "exchange_us_two_ranks_gloo": round(exchange_s * 1e6, 1),
        "estimated_two_rank_ms_per_step": round(hooks_ms + checks_per_step * exchange_s * 1e3, 2),
        "step_ms_with_fingerprints_one_rank": round(statistics.median(samples["with_fingerprints"]) * 1e3, 2),
        "fingerprint_hooks_ms_per_step": round(fingerprint_ms, 2),
        "fingerprints_per_step": fingerprints_per_step,
        "estimated_two_rank_fingerprint_ms_per_step": round(fingerprint_ms + fingerprints_per_step * exchange_s * 1e3, 2),
        "rounds": opts.rounds, "steps_per_round": opts.steps,
        "ms_over_plain_per_round": {k: [round(v * 1e3, 2) for v in vs] for k, vs in per_round.items()},
        "step_ms_samples": {k: [round(t * 1e3, 2) for t in vs] for k, vs in samples.items()},
    }
    result["estimated_share_of_step"] = round(result["estimated_two_rank_ms_per_step"] / plain_ms, 4)
    result["estimated_fingerprint_share_of_step"] = round(result["estimated_two_rank_fingerprint_ms_per_step"] / plain_ms, 4)
    with open(opts.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "step_ms_samples"}, indent=2))


if __name__ == "__main__":
    main()
