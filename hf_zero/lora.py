"""LoRA / PEFT under DeepSpeed ZeRO-3, in one namespace: ``hf_zero.lora.save_adapter``, ``merge_and_save``, ...

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path), LoraConfig(...))  # after TrainingArguments
    trainer = Trainer(model=model, args=args, ...); hf_zero.attach(trainer); trainer.train()
    hf_zero.lora.save_adapter(trainer, "out/adapter")              # every rank calls it (a gather)
    if trainer.is_world_process_zero():
        hf_zero.lora.merge_and_save("out/adapter", path, "out/merged")  # a full model folder

Saving and merging live in hf_zero.checkpoints.adapters, the fixes both doors apply in hf_zero.zero3.peft_fixes
and hf_zero.zero3.recompute.
"""

from .checkpoints.adapters import adapter_state_dict, merge_and_save, save_adapter
from .checkpoints.saved_models import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_problems, is_adapter_folder
from .modeling import has_frozen_parameters, is_peft_model, unwrap_model
from .trainer.gradient_checkpointing import FROZEN_RECOMPUTE_FIX, peft_recompute_problems
from .zero3.peft_fixes import ZERO2_BASE_SHARE, adapters_to_training_dtype, no_leaf_modules_with_frozen_weights, zero2_advice

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "adapter_problems",
    "adapter_state_dict",
    "adapters_to_training_dtype",
    "FROZEN_RECOMPUTE_FIX",
    "has_frozen_parameters",
    "is_adapter_folder",
    "is_peft_model",
    "merge_and_save",
    "no_leaf_modules_with_frozen_weights",
    "peft_recompute_problems",
    "save_adapter",
    "unwrap_model",
    "zero2_advice",
    "ZERO2_BASE_SHARE",
]

if __name__ == "__main__":  # python -m hf_zero.lora ADAPTER BASE OUT: merge in a clean process
    from .checkpoints.adapters import main

    raise SystemExit(main())
