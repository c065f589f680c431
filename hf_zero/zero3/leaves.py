"""ZeRO-3 leaf modules whose weights would never train.

DeepSpeed gathers a leaf module's parameters whole and reduces their gradients in one backward hook on the module
(``register_full_backward_hook``, stage3.py). torch calls such a hook only when the module returns a Tensor or a tuple
(it warns "For backward hooks to be called, module output should be a Tensor or a tuple of Tensors" otherwise). A
Hugging Face model returns a ModelOutput, a dict: made a leaf, its gradients are never reduced into the optimizer's
partitions, and its weights stay as they were while the run goes on (on a GPU silently; on CPU the step fails in
zero_grad with "unknown parameter type"). That happens to the whole model when a stage3_module_granularity_threshold
(5e6, say) makes it one leaf (models under DeepSpeed's 1e9-parameter cap), and to a vision
tower or an inner base model that a threshold or set_z3_leaf_modules makes one.
"""

import torch

from ..compat.deepspeed_api import is_leaf
from ..errors import ConfigError

CHECK_ID = "leaf-outputs"


def returns_model_output(module) -> bool:
    """Whether ``module`` is a Hugging Face model that returns a ModelOutput (its config's return_dict on)."""
    from transformers import PreTrainedModel

    return isinstance(module, PreTrainedModel) and bool(getattr(module.config, "return_dict", True))


def trains(module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def output_problem(name: str, module, output) -> str | None:
    """Why a leaf's weights would not train given what its forward returned, or None."""
    if isinstance(output, (torch.Tensor, tuple)):
        return None
    return (f"module {name or 'the model'} ({type(module).__name__}) is a ZeRO-3 leaf and returns "
            f"{type(output).__name__}: DeepSpeed reduces a leaf's gradients in a module backward hook, which torch "
            "calls only for a Tensor or a tuple output, so its weights would never train. Fix: keep it from being a "
            "leaf (deepspeed.utils.unset_z3_leaf_modules, or zero_optimization.stage3_module_granularity_threshold 0 "
            "where the threshold made it one) and make its blocks leaves instead")


def watch_leaf_outputs(model) -> list:
    """Check each trainable ZeRO-3 leaf's output at its first forward, before any backward can lose its gradients;
    a leaf that returns something else stops the run with its name. Returns the hooks still in place."""
    handles = {}

    def watch(name, module):
        def first_output(module, args, output):
            handles.pop(name).remove()
            problem = output_problem(name, module, output)
            if problem:
                raise ConfigError([f"{problem} [check {CHECK_ID}]"])

        handles[name] = module.register_forward_hook(first_output)

    for name, module in model.named_modules():
        if is_leaf(module) and trains(module):
            watch(name, module)
    return list(handles.values())


# Leaf-module classes that the two-rank exactness gate (benchmarks/1xH200/two_ranks) measured training as DDP does;
# every other leaf on several GPU ranks is unproven. Empty: no GPU run has proven one yet.
PROVEN_ON_RANKS: frozenset = frozenset()
RANKS_MEASUREMENT = ("on 2x H200, runs with a 1.35B Llama's decoder layers as ZeRO-3 leaves trained differently from "
                     "DDP (mean loss of 20 steps +0.03 to +0.10 above DDP's, +0.41 to +0.49 with gradient "
                     "checkpointing; benchmarks/2xH200)")


def leaves_on_ranks(model, ranks: int, on_gpu: bool, proven=PROVEN_ON_RANKS) -> tuple | None:
    """(severity, message) when ZeRO-3 leaf modules train on several GPU ranks and some of their classes are not
    among ``proven``; None otherwise. Nothing is refused: a WARNING while no class is proven, an INFO line for a class
    the gate has not covered once some are. On CPU processes and on one rank, leaves train bit for bit as no leaves."""
    if ranks < 2 or not on_gpu:
        return None
    leaves = [(name or "the model", type(module).__name__) for name, module in model.named_modules() if is_leaf(module)]
    unproven = sorted({kind for _, kind in leaves if kind not in proven})
    if not unproven:
        return None
    shown = ", ".join(name for name, kind in leaves if kind in unproven)
    message = (f"{len(leaves)} ZeRO-3 leaf module(s) on {ranks} GPU ranks ({', '.join(unproven)}: "
               f"{shown if len(shown) < 120 else shown[:117] + '...'}) are not proven to train as DDP does: "
               f"{RANKS_MEASUREMENT}. hf_zero switches off the DeepSpeed path found to free a leaf's weights early "
               "(check leaf-release). Fix, for a run that must match DDP: no leaves (stage3_module_granularity_threshold "
               "0, no set_z3_leaf_modules, torch_compile off under ZeRO-3) where the model allows it; docs/presets.md")
    return ("info" if proven else "warning"), message
