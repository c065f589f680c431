"""How fast DeepSpeed's async I/O writes and reads a swap folder, per aio setting: the disk speed that bounds
zero3_nvme's steps (each one moves the fp32 optimizer states and the 16-bit parameters through that folder).

    python benchmarks/1xH200/largest/aio_sweep.py FOLDER [--gib 2] [--settings 8x1,32x8] [--out aio_sweep.jsonl]

One JSON line (in --out, and on the screen) per (queue_depth, thread_count): GiB/s written and read back with O_DIRECT through a page-locked
buffer, the way DeepSpeed's swapper does it (its aio handle, block size 1 MiB).
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch

GIB = 1024**3
SETTINGS = [(8, 1), (32, 1), (8, 4), (32, 4), (32, 8), (64, 16)]  # (queue_depth, thread_count); first: the preset


def measure(folder: Path, gib: float, queue_depth: int, threads: int, block: int = 1 << 20) -> dict:
    from deepspeed.ops.op_builder import AsyncIOBuilder

    handle = AsyncIOBuilder().load().aio_handle(block, queue_depth, False, True, threads)
    nbytes = int(gib * GIB) // block * block  # O_DIRECT: whole blocks
    buffer = handle.new_cpu_locked_tensor(nbytes, torch.empty(0, dtype=torch.uint8))
    buffer.random_(0, 128)
    path = str(folder / f"aio_{queue_depth}_{threads}.bin")
    rates = {}
    for op in ("write", "read"):
        start = time.perf_counter()
        assert (handle.pwrite if op == "write" else handle.pread)(buffer, path, False, True) != -1
        handle.wait()
        rates[f"{op}_gib_s"] = round(nbytes / GIB / (time.perf_counter() - start), 3)
    handle.free_cpu_locked_tensor(buffer)
    os.remove(path)
    return {"queue_depth": queue_depth, "thread_count": threads, "block_size": block, "gib": gib, **rates}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--gib", type=float, default=2.0, help="bytes per write and read (default 2 GiB)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "aio_sweep.jsonl")
    p.add_argument("--settings", help="QUEUE_DEPTHxTHREADS,... (default: %s)" % ",".join(f"{q}x{t}" for q, t in SETTINGS))
    opts = p.parse_args()
    settings = [tuple(map(int, s.split("x"))) for s in opts.settings.split(",")] if opts.settings else SETTINGS
    opts.folder.mkdir(parents=True, exist_ok=True)
    with opts.out.open("w") as out:  # DeepSpeed logs to stdout: the results go to their own file
        for queue_depth, threads in settings:
            line = json.dumps(measure(opts.folder, opts.gib, queue_depth, threads))
            print(line, flush=True)
            out.write(line + "\n")


if __name__ == "__main__":
    main()
