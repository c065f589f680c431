"""hf_zero inside a Trainer run: TrainingArguments glue, ZeroCallback, and the fixes it applies before the
engine exists (gradient checkpointing, LoRA under ZeRO-3, torch.compile), batch padding and memory logs."""

from .callback import ZeroCallback, attach
from .gradient_checkpointing import (default_checkpointing_kwargs, gradient_checkpointing_kwargs, gradient_checkpointing_on,
                                     peft_recompute_problems)
from .memory import all_ranks_memory, local_memory
from .padding import GPU_PAD_MULTIPLE, padding_advice
from .peft_fixes import adapters_to_training_dtype, no_leaf_modules_with_frozen_weights, zero2_advice
from .training_args import TrainingArguments, accelerate_deepspeed_file, apply_launch_glue, zero_arguments

__all__ = [
    "accelerate_deepspeed_file",
    "apply_launch_glue",
    "adapters_to_training_dtype",
    "all_ranks_memory",
    "attach",
    "default_checkpointing_kwargs",
    "GPU_PAD_MULTIPLE",
    "gradient_checkpointing_kwargs",
    "gradient_checkpointing_on",
    "local_memory",
    "no_leaf_modules_with_frozen_weights",
    "padding_advice",
    "peft_recompute_problems",
    "TrainingArguments",
    "zero2_advice",
    "zero_arguments",
    "ZeroCallback",
]
