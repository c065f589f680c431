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


# Leaf-module classes that the two-rank exactness gate (benchmarks/1xH200/two_ranks) measured training as DDP does
# once their weights are released on DeepSpeed's ordinary path (check leaf-release), eager and as the compile path's
# compiled blocks; every other leaf class on several GPU ranks is unproven.
PROVEN_ON_RANKS: frozenset = frozenset({"LlamaDecoderLayer", "Qwen3MoeSparseMoeBlock"})
RANKS_MEASUREMENT = ("two ranks sharing one H100 over gloo: a 1.35B Llama with its decoder layers as leaves "
                     "(threshold 5e6) and gradient checkpointing, largest loss gap to DDP over 6 steps 0.006 with "
                     "their weights released on the ordinary path, as for ZeRO-3 without leaves, and 0.229 on "
                     "DeepSpeed's fast leaf path (benchmarks/1xH200/two_ranks/h100/gate_1.35b); a Qwen3-MoE with "
                     "its MoE blocks as leaves, first-step gradients equal to DDP's on bf16 weights "
                     "(h100/gate_moe); the compile path's compiled decoder blocks as leaves, first-step gradient "
                     "0.013 from DDP compiled the same way (h100/gate_compile_1.35b); several GPUs over NCCL are not "
                     "measured yet")


def leaves_on_ranks(model, ranks: int, on_gpu: bool, fast_release: bool,
                    proven=PROVEN_ON_RANKS) -> tuple | None:
    """(severity, message) when ZeRO-3 leaf modules train on several GPU ranks and are not proven to train as DDP
    does; None otherwise. ``fast_release``: DeepSpeed still frees the leaves' weights on its fast leaf path (the
    leaf-release fix did not apply). Nothing is refused: a WARNING for leaves on the fast path, an INFO line for leaf
    classes the gate has not covered. On CPU processes and on one rank, leaves train bit for bit as no leaves."""
    if ranks < 2 or not on_gpu:
        return None
    leaves = [(name or "the model", type(module).__name__) for name, module in model.named_modules() if is_leaf(module)]
    unproven = sorted({kind for _, kind in leaves if fast_release or kind not in proven})
    if not unproven:
        return None
    shown = ", ".join(name for name, kind in leaves if kind in unproven)
    shown = shown if len(shown) < 120 else shown[:117] + "..."
    if fast_release:
        return "warning", (
            f"{len(leaves)} ZeRO-3 leaf module(s) on {ranks} GPU ranks ({', '.join(unproven)}: {shown}) release their "
            f"weights on DeepSpeed's fast leaf path, which trains differently from DDP: {RANKS_MEASUREMENT}. "
            "Fix: let check leaf-release switch that path off (it applies within the DeepSpeed releases hf_zero.compat "
            "names; do not skip it), or no leaves (stage3_module_granularity_threshold 0); docs/presets.md")
    return "info", (
        f"{len(leaves)} ZeRO-3 leaf module(s) on {ranks} GPU ranks ({', '.join(unproven)}: {shown}) are of classes the "
        f"two-rank exactness gate has not covered (proven: {', '.join(sorted(proven)) or 'none'}; {RANKS_MEASUREMENT}). "
        "They are released on DeepSpeed's ordinary path; to compare a run with DDP, see docs/development.md")


def _give_an_input_a_gradient(module, args):
    """Forward pre-hook: when no positional input of the leaf needs a gradient, its first floating-point one does
    (the same values, detached from nothing: no earlier part of the graph changes)."""
    if not torch.is_grad_enabled() or any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        return None
    for index, arg in enumerate(args):
        if isinstance(arg, torch.Tensor) and arg.is_floating_point():
            return (*args[:index], arg.detach().requires_grad_(), *args[index + 1:])
    return None


def leaf_inputs_require_grad(model, version: str | None = None) -> str | None:
    """Make every trainable ZeRO-3 leaf's gradients reduced after its backward, not before; returns a note naming the
    leaf classes, or None when the model has no trainable leaf (or the installed DeepSpeed is not one this was read
    against, which logs a WARNING).

    DeepSpeed reduces a leaf's gradients in a full backward hook on the leaf, and zero-fills those still missing.
    torch runs that hook once the gradients of the leaf's positional inputs are computed, or, when none of them needs
    a gradient, as soon as the output's gradient arrives: before the leaf's own backward. DeepSpeed then zero-fills
    every weight's gradient from the released (empty) weight, and autograd cannot add the real gradient to it: the
    first backward stops (RuntimeError: The size of tensor a (0) must match the size of tensor b (4)). A LoRA model's
    first decoder layer is such a leaf (its input is the frozen embedding's output), and so is any leaf after frozen
    weights. A forward pre-hook gives that leaf an input that needs a gradient; computing it adds one input gradient
    per such leaf, which is dropped."""
    from ..compat.deepspeed_api import engine_fix_applies

    leaves = [module for module in model.modules() if is_leaf(module) and trains(module)]
    if not leaves or not engine_fix_applies("leaf-inputs-require-grad", version):
        return None
    for module in leaves:
        if not getattr(module, "_hf_zero_input_gradient", False):
            module.register_forward_pre_hook(_give_an_input_a_gradient, prepend=True)
            module._hf_zero_input_gradient = True
    kinds = ", ".join(sorted({type(module).__name__ for module in leaves}))
    return (f"ZeRO-3 leaf modules ({kinds}): an input that needs no gradient is given one, so DeepSpeed reduces "
            "their gradients after their backward (without it a leaf after frozen weights, such as a LoRA model's "
            "first layer, stops the first backward)")
