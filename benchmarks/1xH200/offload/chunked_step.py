"""The host's part of a ZeRO-1/2 offload step, as DeepSpeed 0.19.8 runs it and in chunks (hf_zero.engine.fixes'
step_partition_in_chunks), timed alone on this machine over a model's fp32 partition (no Trainer, no model).

    OMP_NUM_THREADS=16 python benchmarks/1xH200/offload/chunked_step.py --out chunked_step.jsonl

Each line of the output is one measurement, the median of --repeat steps after one warm-up step:
- ``deepspeed``: the gradient multiplied by the clip factor, DeepSpeedCPUAdam.step over the whole partition, the
  rounding into a pinned 16-bit buffer, its non-blocking copy to the GPU, then a synchronize (the next forward
  waits for the copy);
- ``chunks``: the same work chunk by chunk (--chunks elements each), each chunk's copy started once it is rounded.
Both start from the same weights, gradient and moments; ``same_bits`` says whether one step of each left the same
fp32 weights, moments and 16-bit copy.
"""

import argparse
import json
import os
import statistics
import time

import torch

from hf_zero.engine.offload_step import step_partition_in_chunks


def synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Partition:
    """One rank's flat fp32 partition with its gradient, Adam state (after a first step), pinned 16-bit staging
    buffer and 16-bit target (on the GPU when there is one)."""

    def __init__(self, n: int, seed: int = 0):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        pin = torch.cuda.is_available()
        generator = torch.Generator().manual_seed(seed)
        self.master = torch.nn.Parameter(torch.randn(n, generator=generator))
        self.master.grad = torch.randn(n, generator=generator).mul_(1e-2)
        if pin:
            self.master.data, self.master.grad = self.master.data.pin_memory(), self.master.grad.pin_memory()
        self.adam = DeepSpeedCPUAdam([self.master], lr=1e-4, weight_decay=0.01)
        self.adam.step()  # creates the moments, as DeepSpeed's first step does
        self.staging = torch.empty(n, dtype=torch.bfloat16, pin_memory=pin)
        self.target = torch.empty(n, dtype=torch.bfloat16, device="cuda" if pin else "cpu")
        self.factor = torch.tensor(1.0) / torch.tensor(3.7)  # a clip factor, as DeepSpeed computes it

    def deepspeed_step(self):
        self.master.grad.data.mul_(self.factor)
        self.adam.step()
        self.staging.data.copy_(self.master.data)
        self.target.data.copy_(self.staging.data, non_blocking=True)

    def chunked_step(self, chunk: int):
        step_partition_in_chunks(self.adam, self.adam.param_groups[0], self.master, self.staging, self.target,
                                 self.factor, chunk)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=int, default=1_345_423_360, help="elements (the 1.35B bench model's count)")
    p.add_argument("--chunks", default="262144,1048576,4194304,16777216")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", required=True, help="JSON lines file to append to")
    opts = p.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count()))
    torch.set_num_threads(threads)
    chunks = [int(c) for c in opts.chunks.split(",")]
    base = dict(params=opts.params, threads=threads, cpus=os.cpu_count(), gpu=torch.cuda.is_available())
    rows = []

    def record(**row):
        rows.append({**base, **row})
        print(json.dumps(rows[-1]), flush=True)

    a, b = Partition(opts.params), Partition(opts.params)
    a.deepspeed_step()
    b.chunked_step(chunks[0])
    synchronize()
    same = all(torch.equal(x, y) for x, y in [(a.master, b.master), (a.target, b.target),
                                               (a.adam.state[a.master]["exp_avg"], b.adam.state[b.master]["exp_avg"]),
                                               (a.adam.state[a.master]["exp_avg_sq"], b.adam.state[b.master]["exp_avg_sq"])])
    del b
    record(what="deepspeed", s=timed(a.deepspeed_step, opts.repeat), same_bits=same)
    for chunk in chunks:
        record(what="chunks", chunk=chunk, s=timed(lambda: a.chunked_step(chunk), opts.repeat))
    with open(opts.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
