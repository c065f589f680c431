"""Gradient checkpointing's recompute under ZeRO-3: the kwargs a run without the user's gets, and the combination
that crashes (a frozen base's non-reentrant recompute before DeepSpeed 0.19.3). Both doors use it."""

from ..compat.deepspeed_api import FROZEN_RECOMPUTE_FIX, frozen_recompute_fails
from ..compat.hf_api import model_checkpointing_call
from ..compat.releases import deepspeed_version as installed_deepspeed
from ..config.dotted import zero_stage
from ..config.live import deepspeed_config_of
from ..modeling import has_frozen_parameters, unwrap_model

__all__ = ["FROZEN_RECOMPUTE_FIX", "default_checkpointing_kwargs", "non_reentrant_recompute_fails", "recompute_fails",
           "recompute_problems"]


def recompute_fails(model, config: dict, deepspeed_version: str | None = None) -> bool:
    """Whether a non-reentrant checkpoint recompute of this model fails under ``config`` and this DeepSpeed: ZeRO-3,
    frozen parameters (PEFT) and DeepSpeed before 0.19.3 (``deepspeed_version``, default the installed one)."""
    if zero_stage(config) != 3 or not has_frozen_parameters(unwrap_model(model)):
        return False
    return frozen_recompute_fails(deepspeed_version)


def non_reentrant_recompute_fails(model, args, deepspeed_version: str | None = None) -> bool:
    """recompute_fails for a Trainer run (its arguments' DeepSpeed config)."""
    return recompute_fails(model, deepspeed_config_of(args) or {}, deepspeed_version)


def default_checkpointing_kwargs(model, args, deepspeed_version: str | None = None) -> dict:
    """The kwargs ZeroCallback sets when the user gave none: non-reentrant (transformers 5.24's own default; older
    releases defaulted to reentrant), reentrant only where the non-reentrant recompute fails, as TRL picks it there.
    Both train ZeRO-3 to the same bits on DeepSpeed 0.19.8, so neither choice changes what is learned."""
    return {"use_reentrant": non_reentrant_recompute_fails(model, args, deepspeed_version)}


def recompute_problems(model, config: dict, kwargs: dict, deepspeed_version: str | None = None, *,
                       in_loop: bool = False) -> list:
    """Why checkpointing this model with the checkpoint ``kwargs`` would crash under ``config``; [] if it will not.

    DeepSpeed before 0.19.3 re-partitions frozen parameters inside a non-reentrant recompute and
    torch raises ``CheckpointError: Recomputed values ... saved [64] vs recomputed [0]``.
    ``in_loop``: the fix names the model's switch (a user's loop) instead of the Trainer's argument.
    """
    if kwargs.get("use_reentrant", False):
        return []  # the reentrant path does not compare recomputed tensors
    if not recompute_fails(model, config, deepspeed_version):
        return []
    switch = (model_checkpointing_call("{'use_reentrant': True}") if in_loop
              else "gradient_checkpointing_kwargs={'use_reentrant': True}")
    return [(f"DeepSpeed {installed_deepspeed(deepspeed_version)} re-partitions frozen parameters during a non-reentrant gradient-checkpointing "
             "recompute under ZeRO-3, and backward fails with torch CheckpointError (saved vs recomputed shape [0]). "
             f"Fix: pip install 'deepspeed>={FROZEN_RECOMPUTE_FIX}', or pass {switch} "
             "(transformers makes the embeddings' output require grad, so LoRA layers "
             "inside reentrant checkpoints still get gradients; same losses with DeepSpeed 0.19.2 here).")]
