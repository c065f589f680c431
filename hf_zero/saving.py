"""Gathering ZeRO-3 partitions, and checking that a saved model folder will reload."""

import contextlib
import json
from pathlib import Path


def _is_zero3_param(param) -> bool:
    return hasattr(param, "ds_id")


@contextlib.contextmanager
def gathered_params(params, modifier_rank=None):
    """Full parameters inside the block under ZeRO-3 (a collective: every rank enters); a no-op otherwise."""
    params = list(params)
    if not any(_is_zero3_param(p) for p in params):
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank):
        yield


def gathered_state_dict(model) -> dict:
    """Every parameter and buffer, full and on the CPU, cloned while gathered (collective under ZeRO-3)."""
    state = {}
    with gathered_params(model.parameters()):
        for name, tensor in model.state_dict(keep_vars=False).items():
            state[name] = tensor.detach().to("cpu", copy=True)
    return state


def full_shapes(model) -> dict:
    """Parameter name -> full shape, also for ZeRO-3 partitions (whose local shape is empty)."""
    return {name: tuple(getattr(p, "ds_shape", p.shape)) for name, p in model.named_parameters()}


def _safetensors_headers(folder: Path) -> dict:
    """Tensor name -> shape from the safetensors headers, without reading the weights."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    shapes = {}
    for name in files:
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
    if (folder / "adapter_config.json").exists():
        # A PEFT (LoRA) save: adapter weights only, no config.json or model.safetensors by design.
        from .lora import adapter_problems

        return adapter_problems(folder, model)
    problems = []
    if not (folder / "config.json").exists():
        problems.append(f"{folder}: no config.json.")
    has_weights = (folder / "model.safetensors").exists() or (folder / "model.safetensors.index.json").exists()
    if not has_weights:
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
        expected = full_shapes(model)
        wrong = [n for n, s in saved.items() if n in expected and expected[n] != s]
        if wrong:
            problems.append(f"{folder}: {wrong[0]} has shape {saved[wrong[0]]}, the model has {expected[wrong[0]]}.")
        if not set(saved) & set(expected):
            problems.append(f"{folder}: none of the saved tensor names match the model's parameters.")
    return problems
