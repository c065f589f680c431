"""Gradient checkpointing under ZeRO in a Trainer run: the recompute problems of its arguments (the recompute itself,
shared with the Accelerate door, is hf_zero.zero3.recompute; the settings' names per release are compat.hf_api's)."""

from ..compat.hf_api import checkpointing_kwargs, checkpointing_on
from ..config.live import deepspeed_config_of
from ..zero3.recompute import (FROZEN_RECOMPUTE_FIX, default_checkpointing_kwargs, non_reentrant_recompute_fails,
                               recompute_problems)

__all__ = ["FROZEN_RECOMPUTE_FIX", "default_checkpointing_kwargs", "non_reentrant_recompute_fails",
           "peft_recompute_problems", "recompute_problems"]


def peft_recompute_problems(model, args, deepspeed_version: str | None = None) -> list:
    """recompute_problems for a Trainer run: its arguments' checkpointing switch, kwargs and DeepSpeed config."""
    if not checkpointing_on(args):
        return []
    return recompute_problems(model, deepspeed_config_of(args) or {}, checkpointing_kwargs(args) or {},
                              deepspeed_version)
