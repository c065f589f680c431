"""hf_zero: DeepSpeed ZeRO for the Hugging Face Trainer and Accelerate, made safe and fast.

    args = hf_zero.TrainingArguments(output_dir="out", deepspeed="zero3", bf16=True)
    model = hf_zero.from_pretrained(AutoModelForCausalLM, path, "zero3", dtype=torch.bfloat16)
    trainer = Trainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    hf_zero.attach(trainer)
    trainer.train(); trainer.save_model("out/final")
"""

from .callback import ZeroCallback, attach
from .config import Finding, validate_config
from .distributed import init_distributed, shutdown
from .errors import ConfigError
from .loading import from_pretrained, is_partitioned, release_zero3_config, zero3_init
from .presets import accelerate_config_path, load_config, preset_descriptions, recipe_path
from .saving import gathered_params, gathered_state_dict, saved_model_problems
from .training_args import TrainingArguments

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Finding",
    "TrainingArguments",
    "ZeroCallback",
    "accelerate_config_path",
    "attach",
    "from_pretrained",
    "gathered_params",
    "gathered_state_dict",
    "init_distributed",
    "is_partitioned",
    "load_config",
    "preset_descriptions",
    "recipe_path",
    "release_zero3_config",
    "saved_model_problems",
    "shutdown",
    "validate_config",
    "zero3_init",
]
