"""Two ranks reach hf_zero.shutdown(), or one never does (it stays away ``--away`` seconds, as a rank stuck in a
collective the others left would): the other must stop within the limit, naming it."""

import argparse
import time

import deprecation_guard  # noqa: F401  (hf_zero calling a deprecated API fails the run)
import hf_zero


p = argparse.ArgumentParser()
p.add_argument("--away", type=float, default=0.0, help="rank 1 arrives this many seconds late")
p.add_argument("--limit", type=float, default=5.0)
opts = p.parse_args()

hf_zero.init_distributed()
import torch.distributed as dist  # noqa: E402  (after the process group exists)

if dist.get_rank() == 1:
    time.sleep(opts.away)
started = time.monotonic()
try:
    hf_zero.shutdown(arrival_timeout_s=opts.limit)
except hf_zero.RanksDivergedError as e:
    print(f"rank {dist.get_rank()} gave up after {time.monotonic() - started:.1f} s: {e}", flush=True)
    raise SystemExit(3)
print("hf_zero-test: worker finished", flush=True)  # conftest.FINISHED
