"""Mixture-of-experts blocks under ZeRO-3: found from the model's structure, and made ZeRO-3 leaves where ranks can
run different modules.

ZeRO-3 gathers each module's parameters by a collective just before the module runs, so every rank must run the same
modules in the same order. An MoE block routes each token to a few experts; when the experts are separate modules (a
ModuleList, as transformers 4.x and remote code build them) or a fused experts module whose eager path calls a child
module once per expert hit (transformers 5.x ``experts_implementation="eager"``), ranks with different tokens run
different modules and the gathers stop matching (gloo: "collective mismatch", or DeepSpeed's "disagreement on list
length"). A ZeRO-3 leaf is gathered whole when it starts, on every rank, whatever runs inside it.

A block is found by what it holds, not by its class: a child with the experts (a ModuleList of two or more identical
modules with parameters, or a module whose parameters all have the number of experts as their first dimension, at
least one of them 3-D) beside a router (a 2-D weight with one row per expert). A fused experts module run as one call
(``grouped_mm``, ``batched_mm``) needs no leaf: every rank runs it once per forward, and its parameters are gathered
as one module either way.
"""

import logging
from dataclasses import dataclass

from ..compat.deepspeed_api import leaf_flag
from ..compat.hf_api import experts_implementation
from .partitions import full_numel, full_shape

logger = logging.getLogger("hf_zero")

MOE_LEAVES = ("auto", "off")


# Seen on DeepSpeed 0.19.8, 2 CPU ranks: a ModuleList MoE with frozen experts, made leaves, failed at the first
# backward; the same with a fused DeepSeek-V3's experts frozen trained. Without the leaves such ranks diverge anyway.
FROZEN_LEAF_WARNING = (
    "hf_zero: %d mixture-of-experts block(s) made ZeRO-3 leaves hold frozen parameters (e.g. %s; LoRA or a frozen "
    "base), and hf_zero's leaf-inputs fix does not cover this DeepSpeed release: a leaf after frozen weights can have "
    "its gradients reduced before its backward (the first backward stops with 'RuntimeError: The size of tensor a (0) "
    "must match the size of tensor b ...'). Fix: if it fails so, train with ZeRO-2 (no partitioned parameters to "
    "gather), or use a DeepSpeed release docs/versions.md lists for leaf-inputs.")


def moe_leaves_problem(value) -> str | None:
    """Why ``value`` cannot be the moe_leaves option (None when it can)."""
    if value in MOE_LEAVES:
        return None
    return (f"moe_leaves must be one of {', '.join(map(repr, MOE_LEAVES))}, got {value!r}. Fix: moe_leaves='auto' "
            "(mixture-of-experts blocks whose ranks can run different experts become ZeRO-3 leaves) or 'off'.")


def _fused_experts(module) -> int:
    """The number of experts a fused experts module holds (the first dimension of every weight it owns; its children,
    an activation, hold none), 0 if it is none."""
    import torch

    own = list(module.parameters(recurse=False))
    # its own weights only: a whole MoE block (router + experts) can have experts-first shapes too
    if isinstance(module, torch.nn.ModuleList) or len(own) != len(list(module.parameters())):
        return 0
    shapes = [full_shape(p) for p in own]
    if not any(len(s) == 3 for s in shapes):
        return 0
    firsts = {s[0] for s in shapes}
    return firsts.pop() if len(firsts) == 1 and all(len(s) >= 2 for s in shapes) else 0


def _listed_experts(module) -> int:
    """The number of experts in a ModuleList of identical expert modules, 0 if it is none."""
    import torch

    if not isinstance(module, torch.nn.ModuleList) or len(module) < 2:
        return 0
    signatures = {(type(m), tuple(full_shape(p) for p in m.parameters())) for m in module}
    if len(signatures) != 1 or not next(iter(signatures))[1]:
        return 0
    return len(module)


def _has_router(block, experts_name: str, count: int, widths: set) -> bool:
    """Whether ``block`` holds, outside its experts, a 2-D weight with one row per expert over a width the experts
    take (the router's logits). Embedding tables are no router: a decoder stack beside an embedding of as many rows
    as it has layers would look like one."""
    import torch

    own = [p for p in block.parameters(recurse=False)]
    siblings = [p for name, child in block.named_children() if name != experts_name
                for m in child.modules() if not isinstance(m, torch.nn.Embedding) for p in m.parameters(recurse=False)]
    return any(len(s) == 2 and s[0] == count and s[1] in widths for s in map(full_shape, own + siblings))


@dataclass
class MoeBlock:
    """One mixture-of-experts block of a model."""
    name: str  # the block's name in model.named_modules()
    block: object
    experts: object  # the child that holds the routed experts
    count: int  # routed experts
    fused: bool  # one experts module with 3-D weights (else a ModuleList of experts)

    @property
    def routed_params(self) -> int:
        return sum(full_numel(p) for p in self.experts.parameters())

    @property
    def routes_per_rank(self) -> bool:
        """Whether ranks can run different modules inside this block: separate expert modules, or a fused module
        that calls a child module per expert hit (its eager path; a remote-code module's unknown one)."""
        if not self.fused:
            return True
        has_children = any(True for _ in self.experts.children())
        return has_children and experts_implementation(self.experts) in (None, "eager")


def moe_blocks(model) -> list:
    """Every mixture-of-experts block of ``model``, outermost first (works on zero.Init and meta models alike)."""
    found = []
    for name, block in model.named_modules():
        for child_name, child in block.named_children():
            count = _fused_experts(child)
            fused = bool(count)
            count = count or _listed_experts(child)
            if not count:
                continue
            widths = {d for p in child.parameters() for d in full_shape(p)}
            if _has_router(block, child_name, count, widths):
                found.append(MoeBlock(name, block, child, count, fused))
                break
    return found


def _user_leaf_choice(model, block: MoeBlock) -> bool:
    """Whether the user already decided about leaves in or around ``block`` (set_z3_leaf_modules or
    unset_z3_leaf_modules on it, a module inside it, or a module around it)."""
    if any(leaf_flag(m) is not None for m in block.block.modules()):
        return True
    prefix = block.name.split(".")
    return any(leaf_flag(model.get_submodule(".".join(prefix[:i]))) for i in range(len(prefix)))


def make_moe_leaves(model, config: dict | None, mode: str = "auto", version: str | None = None) -> list:
    """Make every MoE block of ``model`` whose ranks can run different experts a ZeRO-3 leaf, before DeepSpeed builds
    its engine (which registers its hooks, stopping at leaves, when it is built); returns the blocks' names.

    Nothing changes for ``mode`` "off", for a config that is not ZeRO-3, for a config with its own
    ``zero_optimization.leaf_module`` (DeepSpeed applies it when it builds the engine), or for a block where the user
    already set or unset a leaf flag. ``version``: the DeepSpeed release to judge frozen weights in leaves by (default
    the installed one)."""
    zero = (config or {}).get("zero_optimization") or {}
    if mode == "off" or zero.get("stage") != 3:
        return []
    blocks = [b for b in moe_blocks(model) if b.routes_per_rank]
    if not blocks:
        return []
    if "leaf_module" in zero:
        logger.info("hf_zero: mixture-of-experts blocks left to the config's zero_optimization.leaf_module: %s",
                    ", ".join(sorted({type(b.block).__name__ for b in blocks})))
        return []
    from ..compat.deepspeed_api import set_leaf

    made = []
    for block in blocks:
        if not _user_leaf_choice(model, block):
            set_leaf(block.block)
            made.append(block)
    if made:
        # once per run: the same classes on every rank, and rank 0 speaks for them
        from ..distributed import is_main_process

        from ..compat.deepspeed_api import leaf_inputs_fix_covers

        frozen = [b for b in made if any(not p.requires_grad for p in b.block.parameters())]
        if frozen and not leaf_inputs_fix_covers(version) and is_main_process():
            logger.warning(FROZEN_LEAF_WARNING, len(frozen), frozen[0].name)
        if is_main_process():
            logger.info("hf_zero: made %d mixture-of-experts block(s) ZeRO-3 leaves (gathered whole, so ranks that "
                        "route tokens to different experts gather the same parameters): %s", len(made),
                        ", ".join(sorted({type(b.block).__name__ for b in made})))
    return [b.name for b in made]


def active_params(model, top_k: int) -> int | None:
    """Parameters one token runs through: everything but the routed experts, plus ``top_k`` of each block's routed
    experts (shared experts are outside the routed ones, so they count whole). None for a model without MoE blocks."""
    blocks = moe_blocks(model)
    if not blocks:
        return None
    total = sum(full_numel(p) for p in model.parameters())
    routed = sum(b.routed_params for b in blocks)
    active = sum(b.routed_params * min(top_k, b.count) // b.count for b in blocks)
    return total - routed + active
