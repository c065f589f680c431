"""How short the host's part of an offload step can be: DeepSpeed's CPU Adam over a model's fp32 states, and the
copies around it, timed alone on this machine (no Trainer, no model).

    for t in 16 8 4; do OMP_NUM_THREADS=$t python benchmarks/1xH200/offload/cpu_step_floor.py --out floor.jsonl; done

Each line of the output is one measurement (median of --repeat runs after one warm-up), at OMP_NUM_THREADS threads
(DeepSpeed's op has its own OpenMP runtime, which reads it at start; torch's thread count is set to match):
- ``bandwidth``: torch on the host, fp32 tensors of --params elements: ``copy`` (read + write) and ``add`` (2 reads
  + 1 write), in GB/s of bytes moved;
- ``cpu_adam``: DeepSpeedCPUAdam.step over one flat fp32 parameter of --params elements with its gradient (what
  zero2_offload's and zero3_offload's step runs), with the bytes it must move (28 per
  parameter: parameter, gradient, two moments read; parameter and moments written) divided by its time;
- ``to_bf16``: the fp32 master weights written into a pinned bf16 buffer (DeepSpeed does this after the step);
- ``h2d`` / ``d2h``: pinned copies of the bf16 weights to the GPU and of fp32 gradients from it.
The sum of cpu_adam, to_bf16 and h2d is the least time an optimizer step of full CPU offload can leave the GPU
waiting, unless it overlaps GPU work.
"""

import argparse
import json
import os
import statistics
import time

import torch


def timed(fn, repeat: int) -> float:
    fn()  # warm-up: first touch of pages, op builds, CUDA context
    times = []
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=int, default=1_345_423_360, help="elements (the 1.35B bench model's count)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", required=True, help="JSON lines file to append to")
    opts = p.parse_args()
    n = opts.params
    rows = []

    def record(**row):
        row.update(params=n, cpus=os.cpu_count())
        rows.append(row)
        print(json.dumps(row), flush=True)

    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count()))
    torch.set_num_threads(threads)
    a, b = torch.rand(n), torch.rand(n)
    s = timed(lambda: a.copy_(b), opts.repeat)
    record(what="bandwidth", op="copy", threads=threads, s=s, gb_per_s=8 * n / s / 1e9)
    s = timed(lambda: a.add_(b), opts.repeat)
    record(what="bandwidth", op="add", threads=threads, s=s, gb_per_s=12 * n / s / 1e9)

    from deepspeed.ops.adam import DeepSpeedCPUAdam

    param = torch.nn.Parameter(a)
    param.grad = b.mul_(1e-3)
    optimizer = DeepSpeedCPUAdam([param], lr=1e-5, weight_decay=0.0)
    s = timed(optimizer.step, opts.repeat)
    record(what="cpu_adam", threads=threads, s=s, gb_per_s=28 * n / s / 1e9)

    pinned_bf16 = torch.empty(n, dtype=torch.bfloat16, pin_memory=torch.cuda.is_available())
    s = timed(lambda: pinned_bf16.copy_(param.data), opts.repeat)
    record(what="to_bf16", threads=threads, s=s, gb_per_s=6 * n / s / 1e9)
    if torch.cuda.is_available():
        on_gpu = torch.empty(n, dtype=torch.bfloat16, device="cuda")
        s = timed(lambda: on_gpu.copy_(pinned_bf16, non_blocking=True), opts.repeat)
        record(what="h2d", dtype="bf16", s=s, gb_per_s=2 * n / s / 1e9)
        del on_gpu
        grads_gpu = torch.empty(n, dtype=torch.float32, device="cuda")
        pinned_fp32 = torch.empty(n, dtype=torch.float32, pin_memory=True)
        s = timed(lambda: pinned_fp32.copy_(grads_gpu, non_blocking=True), opts.repeat)
        record(what="d2h", dtype="fp32", s=s, gb_per_s=4 * n / s / 1e9)
    with open(opts.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
