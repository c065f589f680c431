"""hf_zero: DeepSpeed ZeRO for the Hugging Face Trainer and Accelerate, made safe and fast.

    args = hf_zero.TrainingArguments(output_dir="out", deepspeed="zero3", bf16=True)
    model = hf_zero.from_pretrained(AutoModelForCausalLM, path, "zero3", dtype=torch.bfloat16)
    trainer = Trainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    hf_zero.attach(trainer)
    trainer.train(); trainer.save_model("out/final")

Names are imported on first use, so ``import hf_zero`` (and ``hf-zero --help``) loads neither torch
nor DeepSpeed until something needs them.
"""

import importlib

from .compat.releases import require_supported_releases

# a package older than its floor stops here with one line, not with an ImportError deep inside a run
require_supported_releases()

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC = {
    "accelerate_config_path": "config.presets",
    "accelerate_config_text": "config.accelerate_yaml",
    "accelerator": "accelerate",
    "attach": "trainer.callback",
    "CheckpointError": "errors",
    "checkpoint_problems": "checkpoints.folders",
    "ConfigError": "errors",
    "convert_to_universal": "checkpoints.resume",
    "export": "checkpoints.export",
    "finish_offload_step": "engine.fixes",
    "enable_long_context": "long_context",
    "Finding": "config.findings",
    "from_pretrained": "zero3.loading",
    "gathered_params": "zero3.gathering",
    "gathered_state_dict": "zero3.gathering",
    "HfZeroError": "errors",
    "init_distributed": "distributed",
    "is_partitioned": "zero3.partitions",
    "last_good_checkpoint": "checkpoints.folders",
    "load_config": "config.presets",
    "LongContext": "long_context",
    "prepare": "accelerate",
    "prepare_resume": "checkpoints.resume",
    "preset_descriptions": "config.presets",
    "preset_names": "config.presets",
    "preset_path": "config.presets",
    "RanksDivergedError": "errors",
    "release_zero3_config": "zero3.loading",
    "save_pretrained": "accelerate",
    "saved_model_problems": "checkpoints.saved_models",
    "shutdown": "distributed",
    "TrainingArguments": "trainer.training_args",
    "UnsafeCheckpointError": "errors",
    "validate_config": "config.validate",
    "zero3_init": "zero3.loading",
    "zero_arguments": "trainer.training_args",
    "ZeroCallback": "trainer.callback",
}
_SUBMODULES = ("accelerate", "checkpoints", "checks", "cli", "config", "engine", "finetune", "long_context", "lora",
               "metrics", "planner", "trainer", "zero3")

__all__ = sorted(_PUBLIC, key=str.lower)


def __getattr__(name):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this hook
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'hf_zero' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC) | set(_SUBMODULES))

