"""The live DeepSpeed config of a run: finding it, and every change hf_zero makes to it.

The HF Trainer builds its DeepSpeed engine later, from the very dict TrainingArguments resolved, so a
change made here before ``trainer.train()`` is what the engine sees. Nothing else in hf_zero writes
into that dict: each change below says what it changed (a note for the run's log), or returns None
when there was nothing to change, and the same functions fix a copy for ``hf-zero check --fix``.
"""

from .dotted import get_dotted

LEAF_THRESHOLD = "stage3_module_granularity_threshold"
GATHER_ON_SAVE = "stage3_gather_16bit_weights_on_model_save"


def deepspeed_config_of(args) -> dict | None:
    """The live DeepSpeed config dict of a Trainer run (the one the engine will be built from), or None."""
    hf_config = getattr(args, "hf_deepspeed_config", None)
    if hf_config is not None:
        return hf_config.config
    plugin = getattr(args, "deepspeed_plugin", None)
    return plugin.deepspeed_config if plugin is not None else None


def _zero_block(config: dict) -> dict:
    zero = config.get("zero_optimization")
    return zero if isinstance(zero, dict) else {}


def leaf_threshold(config: dict):
    """The ZeRO-3 leaf-module threshold when it is set above 0, else None."""
    threshold = _zero_block(config).get(LEAF_THRESHOLD, 0)
    return threshold if isinstance(threshold, (int, float)) and threshold > 0 else None


def drop_gpu_only_settings(config: dict) -> list:
    """Turn off what only works on GPUs; returns a note per change.

    The presets carry the leaf-module threshold tuned on 2x H200; on CPU it crashes DeepSpeed."""
    if leaf_threshold(config) is None:
        return []
    _zero_block(config)[LEAF_THRESHOLD] = 0
    return [f"{LEAF_THRESHOLD} set to 0: DeepSpeed's leaf-module fast path works only on GPUs"]


def no_leaf_modules(config: dict, because: str) -> str | None:
    """Under ZeRO-3, set the leaf-module threshold to 0 (every module fetched on its own); ``because`` says why."""
    threshold = leaf_threshold(config)
    if get_dotted(config, "zero_optimization.stage") != 3 or threshold is None:
        return None
    _zero_block(config)[LEAF_THRESHOLD] = 0
    return f"{LEAF_THRESHOLD} set to 0 (was {threshold:g}): {because}"


def gather_weights_on_save(config: dict) -> str | None:
    """Under ZeRO-3, make save_model write gathered 16-bit weights that ``from_pretrained`` loads."""
    zero = _zero_block(config)
    if zero.get("stage") != 3 or zero.get(GATHER_ON_SAVE, False):
        return None
    zero[GATHER_ON_SAVE] = True
    return (f"{GATHER_ON_SAVE} was off; turned it on so saved models reload "
            "with from_pretrained (gathers 16-bit weights on rank 0 at each save).")


def load_universal_checkpoint(config: dict) -> str:
    """Make the engine load a DeepSpeed universal checkpoint (re-split for its own world size)."""
    config["checkpoint"] = {**config.get("checkpoint", {}), "load_universal": True}
    return "checkpoint.load_universal set to true: the engine re-splits the converted checkpoint for this world size"


def keep_torch_linear(config: dict) -> str:
    """Keep zero.Init from replacing torch's F.linear with DeepSpeed's memory-efficient linear."""
    config.setdefault("zero_optimization", {})["memory_efficient_linear"] = False
    return "zero_optimization.memory_efficient_linear set to false: torch's own F.linear stays"


def fill_adam_hyperparameters(config: dict, *, betas, eps) -> list:
    """Fill the optimizer block's "auto" betas/eps, which the Trainer fills and Accelerate does not; returns notes."""
    params = (config.get("optimizer") or {}).get("params") or {}
    notes = []
    for key, value in (("betas", list(betas)), ("eps", eps)):
        if params.get(key) == "auto":
            params[key] = value
            notes.append(f"optimizer.params.{key} set to {value} (was \"auto\")")
    return notes
