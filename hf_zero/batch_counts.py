"""Whether every rank's data loader yields the same number of batches.

A loop over the whole loader runs one step per batch. When a rank has more batches than another (Accelerate's
``even_batches=False``, a sampler of the loop's own, an IterableDataset split by hand), it runs a step the others
never join: its collectives wait for them, and the others wait elsewhere (a save, the end of the run). The lengths
are compared once, when the loaders are prepared with the model, so a stop later can say that this is the cause.
Loaders without a length (iterable datasets) are left out.
"""

# How long the ranks wait for each other's lengths: they exchange them at the same point of prepare()
EXCHANGE_TIMEOUT_S = 60


def loader_lengths(loaders) -> list:
    """Each loader's number of batches on this rank; None where it has no length."""
    lengths = []
    for loader in loaders:
        try:
            lengths.append(len(loader))
        except (TypeError, NotImplementedError):  # an iterable dataset's loader has no length
            lengths.append(None)
    return lengths


def uneven_batches(per_rank: list) -> str | None:
    """``per_rank``: each rank's loader_lengths, in rank order. A sentence naming the first loader whose length
    differs between ranks, or None when they agree (or cannot be compared)."""
    for index in range(min(map(len, per_rank), default=0)):
        counts = [lengths[index] for lengths in per_rank]
        if None in counts or len(set(counts)) == 1:
            continue
        which = "the data loader" if len(per_rank[0]) == 1 else f"data loader {index + 1} of {len(per_rank[0])}"
        each = ", ".join(f"{count} on rank {rank}" for rank, count in enumerate(counts))
        return (f"uneven batches per rank: {which} prepared with the model yields {each}, so a loop over all of it "
                f"runs more steps on some ranks than on others")
    return None


def compare_across_ranks(loaders, timeout_s: float = EXCHANGE_TIMEOUT_S) -> str | None:
    """uneven_batches over every rank's loaders (a collective of every rank, on a gloo group of its own that gives
    up after ``timeout_s``); None on one process."""
    from .distributed import host_group, is_distributed, simulated_ranks

    if not loaders or not is_distributed() or simulated_ranks():
        return None
    import torch.distributed as dist

    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, loader_lengths(loaders), group=host_group(timeout_s))
    return uneven_batches(per_rank)


UNEVEN_FIX = ("Fix: keep Accelerate's even_batches=True (its default: the shorter ranks repeat samples to match), "
              "or stop every rank after the same number of steps (the smallest rank's count).")
