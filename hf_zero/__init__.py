"""hf_zero: DeepSpeed ZeRO for the Hugging Face Trainer and Accelerate, made safe and fast.

    args = hf_zero.TrainingArguments(output_dir="out", deepspeed="zero3", bf16=True)
    model = hf_zero.from_pretrained(AutoModelForCausalLM, path, "zero3", dtype=torch.bfloat16)
    trainer = Trainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    hf_zero.attach(trainer)
    trainer.train(); trainer.save_model("out/final")
"""

from .callback import ZeroCallback, attach
from .checkpoint import checkpoint_problems, last_good_checkpoint
from .config import Finding, validate_config
from .distributed import init_distributed, shutdown
from .errors import ConfigError
from .export import export
from .loading import from_pretrained, is_partitioned, release_zero3_config, zero3_init
from .presets import accelerate_config_path, load_config, preset_descriptions, recipe_path
from .resume import convert_to_universal, prepare_resume
from .saving import gathered_params, gathered_state_dict, saved_model_problems
from .training_args import TrainingArguments
from . import lora  # LoRA/PEFT under ZeRO-3: hf_zero.lora.save_adapter, merge_and_save

__version__ = "0.1.0"

__all__ = [
    "accelerate_config_path",
    "attach",
    "checkpoint_problems",
    "ConfigError",
    "convert_to_universal",
    "export",
    "Finding",
    "from_pretrained",
    "gathered_params",
    "gathered_state_dict",
    "init_distributed",
    "is_partitioned",
    "last_good_checkpoint",
    "load_config",
    "prepare_resume",
    "preset_descriptions",
    "recipe_path",
    "release_zero3_config",
    "saved_model_problems",
    "shutdown",
    "TrainingArguments",
    "validate_config",
    "zero3_init",
    "ZeroCallback",
]
