"""Whether a saved folder will reload with ``from_pretrained`` / ``PeftModel.from_pretrained`` as trained.

Catches the classic ZeRO-3 failures by reading safetensors headers only: shards saved instead of weights
(no model.safetensors), zero-size tensors saved from partitions instead of gathered weights, and, given the model,
any of its tensors missing or saved with another shape (a fused MoE's experts included, one tensor per expert).
"""

import json
from pathlib import Path

from ..compat.hf_api import saved_shapes
from ..modeling import adapter_key, adapter_params, unwrap_model
from ..zero3.partitions import full_shapes

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def has_model_weights(folder: Path) -> bool:
    return (folder / "model.safetensors").exists() or (folder / "model.safetensors.index.json").exists()


def is_adapter_folder(folder) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).exists()


def safetensors_files(folder: Path) -> list:
    """The weight files of a saved model folder: every shard its index names, else model.safetensors."""
    index = folder / "model.safetensors.index.json"
    return sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]


def _safetensors_headers(folder: Path) -> dict:
    """Tensor name -> shape from the safetensors headers, without reading the weights."""
    from safetensors import safe_open

    shapes = {}
    for name in safetensors_files(folder):
        with safe_open(folder / name, framework="pt") as f:
            for key in f.keys():
                shapes[key] = tuple(f.get_slice(key).get_shape())
    return shapes


def saved_model_problems(folder, model=None) -> list:
    """What would stop ``from_pretrained(folder)`` from giving back the trained model; [] if nothing.

    Catches the classic ZeRO-3 failures: shards only (no model.safetensors), and zero-size
    tensors saved from partitions instead of gathered weights.
    """
    folder = Path(folder)
    if is_adapter_folder(folder):
        # A PEFT (LoRA) save: adapter weights only, no config.json or model.safetensors by design.
        return adapter_problems(folder, model)
    problems = []
    if not (folder / "config.json").exists():
        problems.append(f"{folder}: no config.json.")
    if not has_model_weights(folder):
        hint = " (only ZeRO shards: stage3_gather_16bit_weights_on_model_save was off)" if any(folder.glob("global_step*")) else ""
        problems.append(f"{folder}: no model.safetensors{hint}.")
        return problems
    try:
        saved = _safetensors_headers(folder)
    except Exception as e:  # a truncated or corrupt file: say which folder, not a traceback
        return problems + [f"{folder}: unreadable safetensors ({e})."]
    empty = [name for name, shape in saved.items() if 0 in shape]
    if empty:
        problems.append(f"{folder}: {len(empty)} zero-size tensors saved (e.g. {empty[0]}): ZeRO-3 partitions were saved, not gathered weights.")
    if model is not None:
        expected = expected_saved_shapes(unwrap_model(model))
        if not set(saved) & set(expected):
            return problems + [f"{folder}: none of the saved tensor names match the model's parameters."]
        missing = sorted(set(expected) - set(saved))
        if missing:
            problems.append(f"{folder}: {len(missing)} of the model's {len(expected)} tensors are missing (e.g. "
                            f"{missing[0]}).")
        wrong = [n for n, s in saved.items() if n in expected and expected[n] != s]
        if wrong:
            problems.append(f"{folder}: {wrong[0]} has shape {saved[wrong[0]]}, the model has {expected[wrong[0]]}"
                            f"{f' ({len(wrong)} tensors differ)' if len(wrong) > 1 else ''}.")
    return problems


def expected_saved_shapes(model) -> dict:
    """Tensor name -> shape that ``model.save_pretrained`` writes: every parameter (full size, also for ZeRO-3
    partitions) and persistent buffer, under the names transformers saves them (a fused experts module as one tensor
    per expert), so every saved tensor is compared, not only those whose name matches a parameter."""
    shapes = full_shapes(model)
    parameters = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    buffers = {name: tuple(b.shape) for name, b in model.named_buffers() if name not in parameters}
    persistent = set(model.state_dict(keep_vars=True))
    shapes.update({name: shape for name, shape in buffers.items() if name in persistent})
    return saved_shapes(model, shapes)


def adapter_problems(folder, model=None, adapter_name: str = "default") -> list:
    """What would stop ``PeftModel.from_pretrained(base, folder)`` from giving back the trained
    adapter; [] if nothing. With ``model`` (the PeftModel, partitioned or not) it also checks
    that every adapter tensor is there with its full shape.
    """
    folder = Path(folder)
    problems = []
    if not (folder / ADAPTER_CONFIG).exists():
        problems.append(f"{folder}: no {ADAPTER_CONFIG}.")
    weights = folder / ADAPTER_WEIGHTS
    if not weights.exists():
        return problems + [f"{folder}: no {ADAPTER_WEIGHTS}."]
    try:
        from safetensors import safe_open

        with safe_open(weights, framework="pt") as f:
            saved = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    except Exception as e:  # truncated or corrupt: name the folder, not a traceback
        return problems + [f"{folder}: unreadable {ADAPTER_WEIGHTS} ({e})."]
    if not saved:
        return problems + [f"{folder}: {ADAPTER_WEIGHTS} holds no tensors."]
    empty = [name for name, shape in saved.items() if 0 in shape]
    if empty:
        problems.append(f"{folder}: {len(empty)} of {len(saved)} adapter tensors are zero-size (e.g. {empty[0]}): "
                        "ZeRO-3 partitions were saved, not gathered weights. Fix: hf_zero.lora.save_adapter(trainer, dir) "
                        "or trainer.save_model(dir) instead of model.save_pretrained(dir).")
    if model is not None:
        model = unwrap_model(model)
        shapes = full_shapes(model)
        expected = {adapter_key(n, adapter_name): shapes[n] for n, _ in adapter_params(model, adapter_name)}
        missing = sorted(set(expected) - set(saved))
        if missing:
            problems.append(f"{folder}: {len(missing)} adapter tensors missing (e.g. {missing[0]}).")
        wrong = [k for k in expected if k in saved and saved[k] != expected[k] and 0 not in saved[k]]
        if wrong:
            problems.append(f"{folder}: {wrong[0]} has shape {saved[wrong[0]]}, the model has {expected[wrong[0]]}.")
    return problems
