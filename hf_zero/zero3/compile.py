"""torch.compile under ZeRO-3: compile each repeated block's forward, and leave DeepSpeed's hooks eager.

With ``torch_compile=True`` Accelerate compiles a DeepSpeed model in place (``module.compile()``, whole or per
block), which compiles ``_call_impl`` and so the ZeRO-3 fetch/release hooks with it. Dynamo then specializes
on each parameter's ``ds_id`` and DeepSpeed's module stack, recompiles per layer and per hook state, hits its
recompile limit (8) and runs the rest eagerly: a long compile for no speed (1.35B model on 2x H200: 33.9k
tokens/s with regional compilation against 36.5k without; benchmarks/2xH200).

Compiling only ``block.forward`` keeps the hooks outside the graph: each block is made a ZeRO-3 leaf (hooks on
the block only, none on its linears and norms; set before the engine registers them), so its pre-forward hook
gathers all of the block's parameters before the compiled code runs, and with dynamo's default inlining of
nn.Modules one compiled graph serves every block of the same class. zero.Init also leaves
``torch.nn.functional.linear`` replaced by DeepSpeed's memory-efficient linear, an autograd Function whose
backward asks each weight for its ``ds_id``: dynamo (torch 2.11) guards on that id and recompiles per layer
again (seen on 2x H200), so the original linear comes back, as DeepSpeed's own DeepCompile does.
ZeRO-1/2 have no parameter hooks, so Accelerate's own regional compilation is left to run for them.

Blocks with frozen parameters (LoRA, adapters) are left to Accelerate too: without hf_zero's leaf-inputs fix, the
first such leaf has its gradients reduced before its backward (RuntimeError: The size of tensor a (0) must match
..., eager as well as compiled, on a tiny Llama with PEFT LoRA), and compiled leaves with that fix are not tested yet.
"""

import torch
from accelerate.utils import DynamoBackend
from accelerate.utils.other import is_repeated_blocks

from ..compat.deepspeed_api import set_leaf, zero_init_class
from ..config.live import keep_torch_linear
from ..modeling import has_frozen_parameters


def repeated_blocks(module: torch.nn.Module) -> list:
    """The blocks of the outermost repeated ModuleLists (decoder layers, not the experts inside them), as
    Accelerate's regional compilation finds them."""
    if is_repeated_blocks(module):
        return list(module)
    return [block for child in module.children() for block in repeated_blocks(child)]


def compile_block_forwards(blocks: list, **compile_kwargs) -> None:
    """Make each block a ZeRO-3 leaf and replace its forward with a compiled one. Call before the DeepSpeed
    engine is built (it registers the hooks)."""
    for block in blocks:
        set_leaf(block)
        # an instance attribute: nn.Module._call_impl runs the hooks, then calls self.forward
        block.forward = torch.compile(block.forward, **compile_kwargs)


def restore_torch_linear(config: dict) -> None:
    """Undo zero.Init's replacement of F.linear, and keep a later zero.Init with this config from redoing it."""
    original = getattr(zero_init_class(), "linear_bk", None)
    if original is not None:
        torch.nn.functional.linear = original
    keep_torch_linear(config)


def take_over_zero3_compile(accelerator, model: torch.nn.Module, config: dict) -> str | None:
    """If Accelerate is set to compile this ZeRO-3 model, compile the block forwards instead and switch
    Accelerate's compile off; ``config`` is the live DeepSpeed config the engine will be built from.
    Returns a note for the user, or None when nothing was to be compiled."""
    plugin = accelerator.state.dynamo_plugin
    if plugin.backend == DynamoBackend.NO:
        return None
    blocks = repeated_blocks(model)
    if not blocks:
        return None  # no repeated blocks: leave Accelerate's own compile as the user asked for it
    if any(has_frozen_parameters(block) for block in blocks):
        return ("torch_compile under ZeRO-3 with frozen parameters (LoRA/adapters): left to Accelerate, which compiles "
                "DeepSpeed's parameter hooks too, so expect dynamo to hit its recompile limit and run most layers "
                "eagerly; hf_zero compiles only block forwards when every parameter trains (hf_zero's docs, performance.md)")
    compile_block_forwards(blocks, **plugin.to_kwargs())
    restore_torch_linear(config)
    plugin.backend = DynamoBackend.NO  # read in accelerator.prepare, which the Trainer calls in train()
    return (f"torch_compile under ZeRO-3: compiled the forward of {len(blocks)} repeated blocks (each made a ZeRO-3 "
            "leaf) and left DeepSpeed's parameter hooks eager, with torch's own F.linear; compiling the hooks too "
            "makes dynamo recompile per layer until its limit, then run eagerly (hf_zero's docs, performance.md)")
