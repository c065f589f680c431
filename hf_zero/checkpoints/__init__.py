"""Checkpoints and saved folders: what they hold, whether they will reload, loading them safely,
exporting, resuming on any world size, and LoRA adapters."""

from .adapters import adapter_state_dict, merge_and_save, save_adapter
from .export import DTYPES, export
from .folders import (ZeroCheckpoint, checkpoint_problems, find_zero_checkpoint, inspect_zero_checkpoint,
                      last_good_checkpoint, set_aside_partial, trainer_checkpoints, training_state_problems)
from .resume import convert_to_universal, prepare_resume
from .safe_load import check_checkpoint, guard_deepspeed_loads, safe_torch_load
from .saved_models import adapter_problems, is_adapter_folder, saved_model_problems

__all__ = [
    "adapter_problems",
    "adapter_state_dict",
    "check_checkpoint",
    "checkpoint_problems",
    "convert_to_universal",
    "DTYPES",
    "export",
    "find_zero_checkpoint",
    "guard_deepspeed_loads",
    "inspect_zero_checkpoint",
    "is_adapter_folder",
    "last_good_checkpoint",
    "merge_and_save",
    "prepare_resume",
    "safe_torch_load",
    "save_adapter",
    "saved_model_problems",
    "set_aside_partial",
    "trainer_checkpoints",
    "training_state_problems",
    "ZeroCheckpoint",
]
