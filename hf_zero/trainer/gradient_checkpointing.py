"""Gradient checkpointing under ZeRO: its settings on TrainingArguments, and the combinations that crash."""

from ..compat.deepspeed_api import FROZEN_RECOMPUTE_FIX, frozen_recompute_fails
from ..compat.hf_api import checkpointing_kwargs as gradient_checkpointing_kwargs
from ..compat.hf_api import checkpointing_on as gradient_checkpointing_on
from ..compat.hf_api import set_checkpointing_kwargs as set_gradient_checkpointing_kwargs
from ..compat.hf_api import turn_on_checkpointing as turn_on_gradient_checkpointing
from ..compat.releases import deepspeed_version as installed_deepspeed
from ..config.dotted import zero_stage
from ..config.live import deepspeed_config_of
from ..modeling import has_frozen_parameters, unwrap_model

__all__ = ["FROZEN_RECOMPUTE_FIX", "default_checkpointing_kwargs", "gradient_checkpointing_kwargs", "gradient_checkpointing_on",
           "non_reentrant_recompute_fails", "peft_recompute_problems", "set_gradient_checkpointing_kwargs",
           "turn_on_gradient_checkpointing"]


def non_reentrant_recompute_fails(model, args, deepspeed_version: str | None = None) -> bool:
    """Whether a non-reentrant checkpoint recompute of this model fails under this run's DeepSpeed: ZeRO-3, frozen
    parameters (PEFT) and DeepSpeed before 0.19.3 (``deepspeed_version``, default the installed one)."""
    config = deepspeed_config_of(args) or {}
    if zero_stage(config) != 3 or not has_frozen_parameters(unwrap_model(model)):
        return False
    return frozen_recompute_fails(deepspeed_version)


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
