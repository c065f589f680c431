"""transformers, accelerate, torch and numpy names that differ between the supported releases. Each function takes the
newest spelling when the installed release has it, so nothing here calls a name the newest release deprecates."""


# ---- transformers: activation (gradient) checkpointing ---------------------------------------------------------
# transformers 5.23 renamed gradient_checkpointing* to activation_checkpointing* (the old names warn and go in v6),
# on TrainingArguments and on PreTrainedModel alike.
_ARG_NAMES = ("activation_checkpointing", "gradient_checkpointing")


def checkpointing_arg_name(args) -> str:
    """The TrainingArguments field that switches checkpointing on in the installed transformers (``args``: an
    instance or the class, TRL's configs included)."""
    return next(name for name in _ARG_NAMES if hasattr(args, name))


def checkpointing_on(args) -> bool:
    return bool(any(getattr(args, name, None) for name in _ARG_NAMES))


def checkpointing_kwargs(args):
    return next((getattr(args, f"{name}_kwargs") for name in _ARG_NAMES if getattr(args, f"{name}_kwargs", None)), None)


def turn_on_checkpointing(args) -> None:
    setattr(args, checkpointing_arg_name(args), True)


def set_checkpointing_kwargs(args, kwargs) -> None:
    setattr(args, f"{checkpointing_arg_name(args)}_kwargs", kwargs)


def model_checkpointing_on(model) -> bool:
    """Whether the model runs its layers under activation checkpointing (False for a model without the switch)."""
    if hasattr(type(model), "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def model_checkpointing_kwargs(model) -> dict | None:
    """The kwargs the model's layers call torch's checkpoint with (transformers keeps them in a functools.partial on
    each checkpointed layer); None when no layer is checkpointed."""
    for module in model.modules():
        func = getattr(module, "_gradient_checkpointing_func", None)
        if getattr(module, "gradient_checkpointing", False) and func is not None:
            return dict(getattr(func, "keywords", {}) or {})
    return None


def model_checkpointing_call(kwargs: str) -> str:
    """How a user turns checkpointing on on a model with ``kwargs`` (source text), in the installed transformers."""
    from transformers import PreTrainedModel

    name = next(n for n in _ARG_NAMES if hasattr(PreTrainedModel, f"{n}_enable"))
    return f"model.{name}_enable({name}_kwargs={kwargs})"


def enable_model_checkpointing(model, kwargs: dict) -> None:
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


# ---- transformers: checkpoint rotation ---------------------------------------------------------------------------
def rotate_checkpoints(trainer, output_dir: str, save_total_limit: int) -> None:
    """Delete a run's oldest checkpoint-N folders beyond ``save_total_limit``, as the Trainer itself would (newest by
    mtime; the newest and the Trainer's best checkpoint kept). transformers 5.2 made this a function; before it, a
    Trainer method that reads the limit from the Trainer's arguments, lent back to it for the call."""
    try:
        from transformers.trainer_utils import rotate_checkpoints as rotate
    except ImportError:
        rotate = None
    if rotate is not None:
        rotate(output_dir, save_total_limit=save_total_limit,
               best_model_checkpoint=trainer.state.best_model_checkpoint, use_mtime=True)
        return
    args = trainer.args
    saved, args.save_total_limit = args.save_total_limit, save_total_limit
    try:
        trainer._rotate_checkpoints(use_mtime=True, output_dir=output_dir)
    finally:
        args.save_total_limit = saved


# ---- transformers: mixture-of-experts --------------------------------------------------------------------------
def experts_implementation(experts) -> str | None:
    """How a fused experts module runs ("eager", "grouped_mm", "batched_mm", ...): transformers 5 keeps the choice in
    its config's ``_experts_implementation``; None for a module without one (remote code, transformers 4.x)."""
    return getattr(getattr(experts, "config", None), "_experts_implementation", None)


def saved_shapes(model, shapes: dict) -> dict:
    """Tensor name -> shape as ``model.save_pretrained`` writes a state dict of these parameter ``shapes``: transformers
    5 reverts its load-time weight conversions when it saves (a fused experts module goes out as one tensor per
    expert), on meta tensors here, so nothing is allocated. Releases without conversions write the names as they are."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return dict(shapes)
    if not hasattr(model, "config"):  # not a transformers model: nothing converts its names
        return dict(shapes)
    import torch

    meta = {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}
    return {name: tuple(t.shape) for name, t in revert_weight_conversion(model, meta).items()}


# ---- torch ----------------------------------------------------------------------------------------------------------
def set_allocator_settings(settings: str) -> None:
    """The caching allocator's settings at run time: torch 2.9 moved the setter to the accelerator-generic API."""
    import torch

    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings
    setter(settings)


def legacy_storage_class():
    """The base of torch's typed storage classes (FloatStorage, BFloat16Storage, ...): ``_LegacyStorage`` in torch 2,
    TypedStorage in a release without it."""
    import torch

    return getattr(torch.storage, "_LegacyStorage", torch.storage.TypedStorage)


def default_store():
    """The store behind the default process group (torch.distributed keeps it private; present in every torch 2.x),
    for small host-side exchanges beside the training collectives."""
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


# ---- numpy ----------------------------------------------------------------------------------------------------------
def numpy_array_reconstructor():
    """The function a pickled numpy array is rebuilt with (``multiarray._reconstruct``): numpy 2 moved ``numpy.core``
    to ``numpy._core``; torch runs with either."""
    import numpy as np

    return (getattr(np, "_core", None) or np.core).multiarray._reconstruct


# ---- transformers: the loss under Ulysses sequence parallelism -------------------------------------------------------
def sequence_parallel_loss():
    """transformers' token-weighted loss over the sequence-parallel group (the Trainer's under Ulysses, with the
    gradient scaling each DeepSpeed release needs), or None for a release without it."""
    from transformers.integrations import deepspeed

    return getattr(deepspeed, "deepspeed_sp_compute_loss", None)
