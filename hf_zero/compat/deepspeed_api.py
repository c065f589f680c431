"""What hf_zero knows about particular DeepSpeed releases: the internals each engine fix was read against, the
releases a bug was fixed in, and what each release writes into a checkpoint."""

import logging
from dataclasses import dataclass

from packaging.version import Version

from .releases import deepspeed_version

logger = logging.getLogger("hf_zero")


@dataclass(frozen=True)
class EngineFix:
    """A change hf_zero makes to a built engine, valid for the DeepSpeed releases whose source it was read against
    and tested on (``low <= release < high``): outside them the internals it patches may differ, so it stays out."""
    title: str
    low: str
    high: str
    without_it: str  # what the run gets instead, for the WARNING

    def covers(self, version: Version) -> bool:
        return Version(self.low) <= version < Version(self.high)


ENGINE_FIXES = {
    # stage_1_and_2.py: update_offload_overflow_tracker, step
    "offload-overflow-test": EngineFix(
        "ZeRO offload without the per-parameter inf/NaN test", "0.19.8", "0.20",
        "each gradient's copy to the host waits on a host synchronization (DeepSpeed's own offload speed)"),
    # stage3.py: _reassign_or_swap_out_partitioned_parameters, step
    "pinned-update-copy": EngineFix(
        "ZeRO-3 offload updates copied through pinned memory", "0.19.8", "0.20",
        "DeepSpeed's synchronous copy of each updated sub-group from pageable memory"),
    # stage_1_and_2.py: step, unscale_and_clip_grads, _optimizer_step; DeepSpeedCPUAdam.step
    "offload-step-in-forward": EngineFix(
        "offload step in the next forward", "0.19.8", "0.20", "expect DeepSpeed's own step speed"),
    # runtime/zero/partitioned_param_coordinator.py (fetch_sub_module, release_sub_module), parameter_offload.py;
    # the same code in 0.18.0 and 0.19.8
    "leaf-release-after-compute": EngineFix(
        "ZeRO-3 leaf modules release their gathered weights only after the GPU has used them", "0.18.0", "0.20",
        "with stage3_module_granularity_threshold above 0, a leaf module's gathered weights can be overwritten while "
        "the GPU still computes with them, and several ranks train differently from DDP (docs/presets.md)"),
    # runtime/zero/stage3.py: create_reduce_and_remove_grad_hooks reduces a leaf's gradients in the leaf's
    # register_full_backward_hook and zero-fills any still missing; the same code in 0.18.0 and 0.19.8
    "leaf-inputs-require-grad": EngineFix(
        "ZeRO-3 leaf modules reduce their gradients after their backward, also where no input needs a gradient",
        "0.18.0", "0.20",
        "a leaf module whose inputs need no gradient (the first decoder layer of a LoRA model, a block after frozen "
        "weights) stops the first backward (RuntimeError: The size of tensor a (0) must match the size of tensor b)"),
}

_warned: set = set()


def engine_fix_applies(name: str, version: str | None = None) -> bool:
    """Whether the installed DeepSpeed (or ``version``) is one ENGINE_FIXES[name] was read against. When it is not,
    and the engine would otherwise have taken the fix, log one WARNING per process saying what is skipped and what
    it costs (a speed-up silently gone on the next DeepSpeed release is the failure this guards against)."""
    fix, installed = ENGINE_FIXES[name], deepspeed_version(version)
    if installed is not None and fix.covers(installed):
        return True
    if name not in _warned:
        _warned.add(name)
        logger.warning("hf_zero: %s: not applied on DeepSpeed %s (read against %s to below %s); %s. See docs/versions.md.",
                       fix.title, installed, fix.low, fix.high, fix.without_it)
    return False


def leaf_inputs_fix_covers(version: str | None = None) -> bool:
    """Whether hf_zero's leaf-inputs fix covers this DeepSpeed (default: the installed one), without a WARNING: the
    checks that turn leaves off otherwise ask it before the engine exists."""
    installed = deepspeed_version(version)
    return installed is not None and ENGINE_FIXES["leaf-inputs-require-grad"].covers(installed)


# DeepSpeed PR #8148 (in 0.19.3): before it, ZeRO-3 re-partitioned frozen parameters during a non-reentrant
# checkpoint recompute and torch raised CheckpointError (seen here with 0.19.2).
FROZEN_RECOMPUTE_FIX = "0.19.3"


def frozen_recompute_fails(version: str | None = None) -> bool:
    """Whether this DeepSpeed (default: the installed one) re-partitions frozen parameters inside a non-reentrant
    checkpoint recompute under ZeRO-3."""
    installed = deepspeed_version(version)
    return installed is not None and installed < Version(FROZEN_RECOMPUTE_FIX)


# The newest DeepSpeed in which ZenFlow's stage-3 transposition was seen to break (benchmarks/cpu/zenflow_zero3)
ZENFLOW_ZERO3_CHECKED = Version("0.19.8")


def zenflow_zero3_unchecked(version: str | None = None) -> bool:
    """Whether this DeepSpeed (default: the installed one) is newer than ZENFLOW_ZERO3_CHECKED, so nobody has seen
    whether ZenFlow's stage-3 transposition still breaks there; False for the checked releases, older ones and an
    unknown one (no DeepSpeed installed)."""
    installed = deepspeed_version(version)
    return installed is not None and installed > ZENFLOW_ZERO3_CHECKED


# (module, name) pairs a DeepSpeed release pickles into its own checkpoints beyond torch's tensors and DeepSpeed's
# optimizer classes: before 0.19, engine.py saves ``sparse_tensor_module_names`` as a set (seen in 0.16.0 and 0.18.0
# model_states). A set is plain data; torch's weights_only unpickler builds it too.
CHECKPOINT_PLAIN_DATA = {("builtins", "set")}


def weights_only_classes() -> list:
    """DeepSpeed's plain-data classes that its optim_states pickle and torch's weights_only unpickler must accept
    (the same three in every supported release)."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def zero_to_fp32_converts_dtype() -> bool:
    """Whether the installed DeepSpeed's zero_to_fp32 converts tensors to another dtype while it materializes them
    (``to_torch_tensor(dtype=...)``); 0.18 has no such argument, and the caller converts afterwards."""
    import inspect

    from deepspeed.utils.zero_to_fp32 import to_torch_tensor

    return "dtype" in inspect.signature(to_torch_tensor).parameters


def materialized_zero_tensors(state_dict: dict, sizes_only: bool = False, dtype: str | None = None) -> dict:
    """zero_to_fp32's lazily gathered tensors, materialized (or, ``sizes_only``, as empty tensors of their size);
    with ``dtype`` (bf16 / fp16 / fp32, only where zero_to_fp32_converts_dtype()), converted by DeepSpeed itself."""
    from deepspeed.utils.zero_to_fp32 import to_torch_tensor

    if dtype is None:
        return to_torch_tensor(state_dict, return_empty_tensor=sizes_only)
    return to_torch_tensor(state_dict, return_empty_tensor=sizes_only, dtype=dtype)


# ---- DeepSpeed internals hf_zero reaches for, by the path every supported release (0.18.0 to 0.19.x) keeps them at
def zero_optimizer_classes() -> tuple:
    """(ZeRO-1/2 optimizer, ZeRO-3 optimizer): the engine fixes patch instances of exactly these."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    return DeepSpeedZeroOptimizer, DeepSpeedZeroOptimizer_Stage3


def has_offload_overflow_tracker(optimizer) -> bool:
    """Whether ``optimizer`` tests each offloaded gradient for inf/NaN on the host as it leaves the GPU (ZeRO-1/2's
    ``update_offload_overflow_tracker``, the method the offload-overflow-test fix replaces)."""
    return hasattr(optimizer, "update_offload_overflow_tracker")


def cpu_adam_class():
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam


def zero_init_class():
    """zero.Init's base class, which keeps torch's own F.linear (``linear_bk``) while zero.Init replaces it."""
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses

    return InsertPostInitMethodToModuleSubClasses


def config_parser():
    """DeepSpeed's own config parser, which ``hf-zero check`` runs on a config."""
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig


def tiled_mlp():
    """ALST's sequence-tiled MLP (an autograd Function)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    return TiledMLP


def fp32_state_dict_from_zero_checkpoint(checkpoint_dir: str, tag: str | None, lazy: bool = True) -> dict:
    """zero_to_fp32's consolidation of a ZeRO checkpoint (any stage, any world size), lazily by default."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=tag, lazy_mode=lazy)


# ---- ZeRO-3 leaf modules ----------------------------------------------------------------------------------------
# DeepSpeed keeps a module's leaf flag in the attribute ``_z3_leaf``: set_z3_leaf_modules sets it True,
# unset_z3_leaf_modules False; z3_leaf_module() reads both as a bool, so an explicit "not a leaf" needs the attribute.
def leaf_flag(module) -> bool | None:
    """A module's ZeRO-3 leaf flag as the user (or DeepSpeed) set it; None where nobody set one."""
    value = getattr(module, "_z3_leaf", None)
    return None if value is None else bool(value)


def set_leaf(module) -> None:
    """Make ``module`` a ZeRO-3 leaf: the engine, built afterwards, gathers its parameters whole when it starts."""
    from deepspeed.utils import set_z3_leaf_module

    set_z3_leaf_module(module, True)


def param_coordinator(engine):
    """The ZeRO-3 engine's parameter coordinator (what fetches and releases each module's weights); None for other
    stages."""
    offload = getattr(getattr(engine, "optimizer", None), "parameter_offload", None)
    return getattr(offload, "param_coordinator", None)


def is_leaf(module) -> bool:
    """Whether DeepSpeed treats ``module`` as a ZeRO-3 leaf (gathered whole, its gradients reduced when its backward
    ends), however it became one: set_z3_leaf_modules, DeepSpeed's default list, or the threshold."""
    from deepspeed.utils import z3_leaf_module

    return z3_leaf_module(module)


def gather_target(frame, names: dict) -> str | None:
    """What a thread stopped in ``frame`` (one frame of its stack) waits for DeepSpeed to gather, named from
    ``names`` (id(module) -> name), or None where the frame is not one of ZeRO-3's gathers. Read against 0.18.0 and
    0.19.8: PartitionedParameterCoordinator.fetch_sub_module holds the module in ``current_submodule``; a parameter
    read directly is gathered by ZeROOrderedDict.__getitem__ (parameter_offload.py) with ``_parent_module``/``key``."""
    code = frame.f_code
    if code.co_name == "__getitem__" and code.co_filename.endswith("parameter_offload.py"):
        owner = getattr(frame.f_locals.get("self"), "_parent_module", None)
        key = frame.f_locals.get("key")
        prefix = names.get(id(owner), "?")
        return (f"parameter '{key if prefix == 'the model' else prefix + '.' + str(key)}' (read directly, not by "
                f"calling its module)")
    if code.co_name == "fetch_sub_module":
        module = frame.f_locals.get("current_submodule")
        if module is not None and id(module) in names:
            return repr(names[id(module)])
    return None
