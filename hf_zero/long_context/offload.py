"""Checkpointed layer inputs in host memory: torch's save_on_cpu around each checkpoint call.

transformers' own ``activation_checkpointing_kwargs={"offload": True}`` does the same with pinned memory always,
which a CPU-only torch refuses ("pin_memory=True requires a CUDA or other accelerator backend"); here memory is
pinned only where a GPU is, so the same switch runs (and is tested) on CPU.
"""

import functools
import os

from ..compat.hf_api import set_allocator_settings

__all__ = ["offloaded", "exact_size_pinned_blocks", "pinned_blocks_exact", "pinned_threshold_configured"]


def offloaded(checkpoint_fn):
    """``checkpoint_fn`` (transformers' per-layer checkpoint function) with its saved inputs on the host."""
    import torch

    if getattr(checkpoint_fn, "_hf_zero_offloaded", False):
        return checkpoint_fn
    pinned = torch.cuda.is_available()
    if pinned:
        exact_size_pinned_blocks()

    @functools.wraps(checkpoint_fn)
    def checkpoint_offloaded(function, *args, **kwargs):
        if not torch.is_grad_enabled():
            return checkpoint_fn(function, *args, **kwargs)
        with torch.autograd.graph.save_on_cpu(pin_memory=pinned):
            return checkpoint_fn(function, *args, **kwargs)

    checkpoint_offloaded._hf_zero_offloaded = True
    return checkpoint_offloaded


@functools.lru_cache(maxsize=None)
def pinned_blocks_exact() -> bool:
    """Whether this torch gives large pinned blocks their exact size (the pinned_max_round_threshold_mb setting),
    as enable_long_context asks it to; torch 2.11 rounds them up to a power of two."""
    try:
        set_allocator_settings("pinned_max_round_threshold_mb:64")
    except (RuntimeError, ValueError, AttributeError):
        return False
    return True


def exact_size_pinned_blocks() -> None:
    """torch's pinned-memory cache rounds each block up to a power of two: a 2.3 GiB layer input would hold
    4 GiB of host RAM. Blocks above 64 MiB get their exact size where torch has the setting (2.13 has it, 2.11
    does not) and the user has not chosen a threshold."""
    if not pinned_threshold_configured():
        pinned_blocks_exact()


def pinned_threshold_configured() -> bool:
    """Whether the user's allocator settings choose the pinned cache's rounding threshold themselves."""
    configured = os.environ.get("PYTORCH_ALLOC_CONF", "") + os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return "pinned_max_round_threshold_mb" in configured
