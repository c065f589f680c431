"""Gradient checkpointing under ZeRO: its settings on TrainingArguments, and the combinations that crash."""

from packaging.version import Version

from ..config.dotted import zero_stage
from ..config.live import deepspeed_config_of
from ..modeling import has_frozen_parameters, unwrap_model
from ..versions import deepspeed_version as installed_deepspeed

# DeepSpeed PR #8148 (in 0.19.3): before it, ZeRO-3 re-partitioned frozen parameters during a
# non-reentrant checkpoint recompute and torch raised CheckpointError (seen here with 0.19.2).
FROZEN_RECOMPUTE_FIX = "0.19.3"


def gradient_checkpointing_on(args) -> bool:
    return bool(getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", None))


def gradient_checkpointing_kwargs(args):
    return getattr(args, "activation_checkpointing_kwargs", None) or getattr(args, "gradient_checkpointing_kwargs", None)


def turn_on_gradient_checkpointing(args) -> None:
    for name in ("activation_checkpointing", "gradient_checkpointing"):  # 5.24's name and its deprecated alias
        if hasattr(args, name):
            setattr(args, name, True)


def set_gradient_checkpointing_kwargs(args, kwargs) -> None:
    # transformers 5.24 reads activation_checkpointing_kwargs; older 5.x gradient_checkpointing_kwargs
    for name in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"):
        if hasattr(args, name):
            setattr(args, name, kwargs)


def non_reentrant_recompute_fails(model, args, deepspeed_version: str | None = None) -> bool:
    """Whether a non-reentrant checkpoint recompute of this model fails under this run's DeepSpeed: ZeRO-3, frozen
    parameters (PEFT) and DeepSpeed before 0.19.3 (``deepspeed_version``, default the installed one)."""
    config = deepspeed_config_of(args) or {}
    if zero_stage(config) != 3 or not has_frozen_parameters(unwrap_model(model)):
        return False
    version = installed_deepspeed(deepspeed_version)
    return version is not None and version < Version(FROZEN_RECOMPUTE_FIX)


def default_checkpointing_kwargs(model, args, deepspeed_version: str | None = None) -> dict:
    """The kwargs ZeroCallback sets when the user gave none: non-reentrant (transformers 5.24's own default; older
    releases defaulted to reentrant), reentrant only where the non-reentrant recompute fails, as TRL picks it there.
    Both train ZeRO-3 to the same bits on DeepSpeed 0.19.8, so neither choice changes what is learned."""
    return {"use_reentrant": non_reentrant_recompute_fails(model, args, deepspeed_version)}


def peft_recompute_problems(model, args, deepspeed_version: str | None = None) -> list:
    """Why gradient checkpointing of this PEFT model would crash under ZeRO-3; [] if it will not.

    DeepSpeed before 0.19.3 re-partitions frozen parameters inside a non-reentrant recompute and
    torch raises ``CheckpointError: Recomputed values ... saved [64] vs recomputed [0]``.
    """
    if not gradient_checkpointing_on(args):
        return []
    if (gradient_checkpointing_kwargs(args) or {}).get("use_reentrant", False):
        return []  # the reentrant path does not compare recomputed tensors
    if not non_reentrant_recompute_fails(model, args, deepspeed_version):
        return []
    return [(f"DeepSpeed {installed_deepspeed(deepspeed_version)} re-partitions frozen parameters during a non-reentrant gradient-checkpointing "
             "recompute under ZeRO-3, and backward fails with torch CheckpointError (saved vs recomputed shape [0]). "
             f"Fix: pip install 'deepspeed>={FROZEN_RECOMPUTE_FIX}', or pass gradient_checkpointing_kwargs="
             "{'use_reentrant': True} (transformers makes the embeddings' output require grad, so LoRA layers "
             "inside reentrant checkpoints still get gradients; same losses with DeepSpeed 0.19.2 here).")]
