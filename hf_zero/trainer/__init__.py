"""hf_zero inside a Trainer run: TrainingArguments glue, ZeroCallback, and the fixes it applies before the
engine exists (gradient checkpointing; LoRA under ZeRO-3 and batch padding, from hf_zero.zero3 and
hf_zero.batch_padding, which hf_zero.checks shares with the Accelerate door) and memory logs.

ZeroCallback, attach and the TrainingArguments glue are imported on first use (they import torch and transformers)."""

import importlib

from ..batch_padding import GPU_PAD_MULTIPLE, padding_advice
from ..zero3.peft_fixes import adapters_to_training_dtype, no_leaf_modules_with_frozen_weights, zero2_advice
from .gradient_checkpointing import default_checkpointing_kwargs, peft_recompute_problems
from .memory import all_ranks_memory, local_memory

_LAZY = {"ZeroCallback": "callback", "attach": "callback", "TrainingArguments": "training_args",
         "accelerate_deepspeed_file": "training_args", "apply_launch_glue": "training_args",
         "zero_arguments": "training_args"}

__all__ = [
    "accelerate_deepspeed_file",
    "apply_launch_glue",
    "adapters_to_training_dtype",
    "all_ranks_memory",
    "attach",
    "default_checkpointing_kwargs",
    "GPU_PAD_MULTIPLE",
    "local_memory",
    "no_leaf_modules_with_frozen_weights",
    "padding_advice",
    "peft_recompute_problems",
    "TrainingArguments",
    "zero2_advice",
    "zero_arguments",
    "ZeroCallback",
]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hf_zero.trainer' has no attribute {name!r}")
