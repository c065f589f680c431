"""ZeRO-3 leaves by default: each of the model's repeated blocks (its decoder layers) gathered with one all-gather.

Under ZeRO-3 DeepSpeed gathers a module's weights when the module starts and releases them when it ends: a Llama
decoder layer (seven Linears, two norms) costs nine gathers in the forward and nine in the backward, each a collective
with its own launch and wait. A layer made a ZeRO-3 leaf is gathered once, as FSDP gathers one wrapped layer. Where
hf_zero drives a ZeRO-3 run (ZeroCallback, hf_zero.prepare, hf-zero finetune) the repeated blocks become leaves before
the engine is built, on DeepSpeed's ordinary release path (no granularity threshold: its fast path is the one that
trains wrongly on several GPUs) and with leaf-inputs for leaves after frozen weights. The presets stay plain: the same
JSON under a plain Trainer trains as DeepSpeed does.

Left alone: a config that picks its own leaves (a stage3_module_granularity_threshold above 0, or
zero_optimization.leaf_module), a model in which the user set or unset a leaf flag, a model with long context's tiled MLP
or offloaded checkpoints (they run a layer's parts on their own in the backward; inside a leaf the first backward
stopped), blocks inside a vision tower (a rank without images runs the tower on a dummy input there, which leaves are
not proven with), blocks that return a ModelOutput, and DeepSpeed releases leaf-inputs does not cover (one line says
so).
"""

import logging

from ..compat.deepspeed_api import leaf_flag, leaf_inputs_fix_covers, set_leaf
from ..config.live import leaf_threshold
from ..distributed import is_main_process
from ..errors import ConfigError
from ..long_context.switch import long_context_of
from .compile import repeated_blocks
from .leaves import returns_model_output
from .modalities import vision_language_model, vision_tower_name

logger = logging.getLogger("hf_zero")

MODES = ("auto", "off")


def leaves_problem(value) -> str | None:
    """Why ``value`` is not a ``leaves`` option (None when it is): "auto", "off", or a list of block class names."""
    if value in MODES:
        return None
    if isinstance(value, (list, tuple)) and value and all(isinstance(name, str) and name for name in value):
        return None
    return (f"leaves must be 'auto', 'off' or a list of module class names, got {value!r}. "
            "Fix: leaves='auto' (the model's repeated blocks), leaves='off', or leaves=['LlamaDecoderLayer']")


def _tower_prefix(model) -> str | None:
    vlm = vision_language_model(model)
    if vlm is None:
        return None
    name = vision_tower_name(model, vlm)
    return None if name == "the vision tower" else name + "."


def candidate_blocks(model) -> list:
    """(name, module) of every block of the outermost repeated ModuleLists, outside a vision tower."""
    names = {id(module): name for name, module in model.named_modules()}
    tower = _tower_prefix(model)
    return [(names[id(block)], block) for block in repeated_blocks(model)
            if not (tower and (names[id(block)] + ".").startswith(tower)) and not returns_model_output(block)]


def make_block_leaves(model, config: dict | None, mode="auto", version: str | None = None) -> str | None:
    """Make ``model``'s repeated blocks (or, for a list ``mode``, its modules of those classes) ZeRO-3 leaves before
    DeepSpeed builds its engine; returns a note naming what it made, or None when it made nothing. Raises
    ConfigError for a class name the model does not have."""
    zero = (config or {}).get("zero_optimization") or {}
    if mode == "off" or zero.get("stage") != 3:
        return None
    if leaf_threshold(config) or "leaf_module" in zero:
        return None  # the config's own leaves; DeepSpeed makes them when it builds the engine
    if any(leaf_flag(module) is not None for module in model.modules()):
        return None  # the user's own set_z3_leaf_modules / unset_z3_leaf_modules
    parts = long_context_of(model)
    if parts is not None and (parts.tiled_mlp or parts.offload_activations):
        # the tiled MLP recomputes each MLP shard by shard in its own backward; inside a leaf the first backward
        # stopped on 2 CPU ranks (RuntimeError: The size of tensor a (0) must match the size of tensor b (64))
        if is_main_process():
            logger.info("hf_zero: ZeRO-3 leaves left out: long context's tiled MLP and offloaded checkpoints run each "
                        "layer's parts on their own in the backward, which leaves are not proven with")
        return None
    if isinstance(mode, (list, tuple)):
        wanted = set(mode)
        present = {type(module).__name__ for module in model.modules()}
        unknown = sorted(wanted - present)
        if unknown:
            blocks = sorted({type(block).__name__ for _, block in candidate_blocks(model)}) or ["none found"]
            raise ConfigError(f"leaves names {unknown}, which this model ({type(model).__name__}) does not have. Fix: "
                              f"use its repeated blocks ({', '.join(blocks)}), leaves='auto' or leaves='off'")
        chosen = [(name, module) for name, module in model.named_modules() if type(module).__name__ in wanted]
        why = "the classes leaves= names"
    else:
        chosen = candidate_blocks(model)
        why = "the model's repeated blocks"
    if not chosen:
        return None
    if not leaf_inputs_fix_covers(version):
        if is_main_process():
            logger.info("hf_zero: ZeRO-3 leaves left out: hf_zero's leaf fixes were not read against this DeepSpeed "
                        "release, so each module keeps its own gather (docs/versions.md)")
        return None
    for _, module in chosen:
        set_leaf(module)
    kinds = ", ".join(sorted({type(module).__name__ for _, module in chosen}))
    return (f"made {len(chosen)} modules ZeRO-3 leaves ({kinds}: {why}): each is gathered with one all-gather when it "
            "starts, instead of one per Linear. To keep DeepSpeed's per-module gathers: leaves='off'")
