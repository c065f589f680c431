"""What kind of model a run trains: the user's model behind a Trainer or engine, PEFT adapters, frozen weights."""

from pathlib import Path


def is_trainer(obj) -> bool:
    return hasattr(obj, "args") and hasattr(obj, "model_wrapped")


def unwrap_model(model):
    """The user's model from a Trainer, a DeepSpeedEngine or the model itself."""
    model = getattr(model, "model", model) if is_trainer(model) else model
    return getattr(model, "module", model)  # DeepSpeedEngine / DDP keep the model in .module


def is_peft_model(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(unwrap_model(model), PeftModel)


def has_frozen_parameters(module) -> bool:
    """Whether some parameter does not train (LoRA, adapters, a frozen tower). By requires_grad, not numel:
    under zero.Init a parameter's numel() is its partition's, 0 on most ranks."""
    return any(not p.requires_grad for p in module.parameters())


def adapter_params(model, adapter_name: str) -> list:
    """(name, param) of what peft saves for ``adapter_name``: its LoRA tensors and modules_to_save copies."""
    marker = f".{adapter_name}."
    return [(n, p) for n, p in model.named_parameters() if marker in n and (p.requires_grad or "lora_" in n
                                                                            or "modules_to_save" in n)]


def adapter_key(param_name: str, adapter_name: str) -> str:
    """named_parameters() name -> the key peft writes (the adapter name is dropped)."""
    return param_name.replace(f".{adapter_name}.", ".").replace(".modules_to_save.", ".")


def adapter_folder(out_dir: Path, adapter_name: str) -> Path:
    """Where peft writes an adapter: adapters other than "default" go into a sub-folder of that name."""
    return out_dir if adapter_name == "default" else out_dir / adapter_name
