"""Per-rank memory figures, gathered to every rank so rank 0 can log them all."""

import resource

from ..distributed import is_distributed

_GIB = 1024**3


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize()


def local_memory() -> dict:
    """This process: GPU allocated/reserved/peak when on a GPU, else resident host memory (GiB)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return {
            "alloc_gib": torch.cuda.memory_allocated() / _GIB,
            "reserved_gib": torch.cuda.memory_reserved() / _GIB,
            "peak_gib": torch.cuda.max_memory_allocated() / _GIB,
        }
    # ru_maxrss is in KiB on Linux
    return {"rss_gib": _rss_bytes() / _GIB, "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2}


def all_ranks_memory() -> dict:
    """``{"mem/rank0/alloc_gib": ..., ...}`` for every rank (a collective when a process group exists)."""
    import torch
    import torch.distributed as dist

    mine = local_memory()
    names = sorted(mine)
    if not is_distributed() or dist.get_world_size() == 1:
        return {f"mem/rank0/{n}": round(mine[n], 4) for n in names}
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    local = torch.tensor([mine[n] for n in names], dtype=torch.float64, device=device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return {f"mem/rank{r}/{n}": round(float(t[i]), 4) for r, t in enumerate(gathered) for i, n in enumerate(names)}
