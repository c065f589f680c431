"""TrainingArguments that accept a preset name for ``deepspeed`` and do the launch glue once."""

import os
from dataclasses import dataclass, field

import transformers

from ..config.live import drop_gpu_only_settings
from ..config.presets import load_config
from ..config.validate import check_config
from ..distributed import has_gpu, init_distributed, world_size
from ..errors import ConfigError


def accelerate_deepspeed_file():
    """The DeepSpeed JSON an ``accelerate launch --config_file recipes/accelerate/...`` run uses."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true", "yes"):
        return os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE") or None
    return None


@dataclass
class TrainingArguments(transformers.TrainingArguments):
    """``transformers.TrainingArguments`` for DeepSpeed ZeRO runs that work the same everywhere.

    - ``deepspeed`` also takes a preset name ("zero3"), resolved to the shipped JSON;
    - the config is checked against DeepSpeed's own parser before any process group exists,
      and every problem is reported at once (ConfigError);
    - on a machine without a GPU it sets ``use_cpu=True`` (without it, 2 CPU ranks each train
      silently as world size 1) and refuses fp16, which DeepSpeed's CPU accelerator lacks;
    - it starts the process group (gloo on CPU, NCCL on GPU) before the Trainer computes batch
      sizes, and fills RANK/WORLD_SIZE for a plain ``python train.py``.
    """

    nvme_path: str | None = field(
        default=None,
        metadata={"help": "Folder on a fast local disk for ZeRO-Infinity (zero3_nvme) offload."},
    )

    def __post_init__(self):
        source = self.deepspeed if self.deepspeed is not None else accelerate_deepspeed_file()
        if source is not None:
            on_cpu = not has_gpu()
            config = load_config(source, nvme_path=self.nvme_path)
            if on_cpu and self.fp16:
                raise ConfigError("fp16 was requested, but DeepSpeed on the CPU does not support fp16. "
                                  "Fix: use --bf16 (or no mixed precision) on CPU machines.")
            if on_cpu:
                drop_gpu_only_settings(config)
            check_config(config, on_cpu=on_cpu, world_size=world_size(),
                         source=source if isinstance(source, str) else None)
            if on_cpu:
                self.use_cpu = True
            init_distributed()
            if self.deepspeed is not None:
                # A resolved dict: preset names and nvme_path are ours, the Trainer wants a path or dict.
                self.deepspeed = config
        super().__post_init__()
