"""Gradient checkpointing under ZeRO in a Trainer run: its settings on TrainingArguments, and the recompute
problems of its arguments (the recompute itself, shared with the Accelerate door, is hf_zero.zero3.recompute)."""

from ..compat.hf_api import checkpointing_kwargs as gradient_checkpointing_kwargs
from ..compat.hf_api import checkpointing_on as gradient_checkpointing_on
from ..compat.hf_api import set_checkpointing_kwargs as set_gradient_checkpointing_kwargs
from ..compat.hf_api import turn_on_checkpointing as turn_on_gradient_checkpointing
from ..config.live import deepspeed_config_of
from ..zero3.recompute import (FROZEN_RECOMPUTE_FIX, default_checkpointing_kwargs, non_reentrant_recompute_fails,
                               recompute_problems)

__all__ = ["FROZEN_RECOMPUTE_FIX", "default_checkpointing_kwargs", "gradient_checkpointing_kwargs", "gradient_checkpointing_on",
           "non_reentrant_recompute_fails", "peft_recompute_problems", "recompute_problems",
           "set_gradient_checkpointing_kwargs", "turn_on_gradient_checkpointing"]


def peft_recompute_problems(model, args, deepspeed_version: str | None = None) -> list:
    """recompute_problems for a Trainer run: its arguments' checkpointing switch, kwargs and DeepSpeed config."""
    if not gradient_checkpointing_on(args):
        return []
    return recompute_problems(model, deepspeed_config_of(args) or {}, gradient_checkpointing_kwargs(args) or {},
                              deepspeed_version)
