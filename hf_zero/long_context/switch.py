"""Long sequences on one GPU: the parts of DeepSpeed's ALST that transformers does not wire, behind one switch.

Per token, the plain Trainer with gradient checkpointing keeps (1.35B Llama, bf16) the full ``seq x vocab``
logits with their fp32 copy and gradient, each checkpointed layer's input, and one layer's MLP intermediates
while it recomputes. ``enable_long_context`` removes each of them with a part the field already ships:

- ``fused_loss``: TRL's fused LM head (``trl.trainer.utils.add_fused_lm_head``) scores the labelled positions in
  chunks, so the logits never exist whole; the loss is the same token-mean cross-entropy.
- ``tiled_mlp``: DeepSpeed's ``TiledMLP`` runs each decoder layer's MLP on sequence shards of ``hidden_size``
  tokens and recomputes them in backward, so one shard's intermediates exist at a time.
- ``offload_activations``: with gradient checkpointing, each checkpointed layer's input is saved to
  pinned host memory during forward and brought back in backward (torch's ``save_on_cpu`` around each checkpoint
  call, as transformers' ``activation_checkpointing_kwargs={'offload': True}`` does on GPUs).

The attention must be memory-linear in the sequence (sdpa or flash attention; eager builds ``seq x seq`` scores).
"""

import functools
import math
import types
from dataclasses import asdict, dataclass, fields

from ..compat.deepspeed_api import tiled_mlp
from ..errors import ConfigError
from ..modeling import unwrap_model
from .offload import offloaded

LINEAR_MEMORY_ATTENTION = ("sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
_MARK = "_hf_zero_long_context"  # set on the causal LM: which parts it runs


@dataclass(frozen=True)
class LongContext:
    """Which parts of the long-context setup a model runs (all by default)."""
    tiled_mlp: bool = True
    fused_loss: bool = True
    offload_activations: bool = True

    @classmethod
    def from_option(cls, option) -> "LongContext | None":
        """ZeroCallback's ``long_context=`` option: True / False / None, a dict of parts, or a LongContext."""
        if option is None or option is False:
            return None
        if option is True:
            return cls()
        if isinstance(option, cls):
            return option
        if isinstance(option, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(option) - known)
            if unknown:
                raise ConfigError(f"long_context: unknown part(s) {', '.join(unknown)}; the parts are "
                                  f"{', '.join(sorted(known))} (each true or false).")
            return cls(**{k: bool(v) for k, v in option.items()})
        raise ConfigError(f"long_context must be true, false, or a dict of parts ({', '.join(f.name for f in fields(cls))}), "
                          f"got {option!r}")

    def as_dict(self) -> dict:
        return asdict(self)


def causal_lm(model):
    """The transformers model under a Trainer, an engine or a PEFT wrapper (the one with the LM head)."""
    model = unwrap_model(model)
    get_base = getattr(model, "get_base_model", None)  # peft.PeftModel
    return get_base() if callable(get_base) and hasattr(model, "peft_config") else model


def long_context_of(model) -> LongContext | None:
    """The parts ``enable_long_context`` turned on for this model, or None."""
    return getattr(causal_lm(model), _MARK, None)


def decoder_layers(model) -> list:
    """The repeated blocks transformers checkpoints (GradientCheckpointingLayer), in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in causal_lm(model).modules() if isinstance(m, GradientCheckpointingLayer)]


def _dense_mlp(layer):
    """The layer's MLP if TiledMLP can run it (one tensor in, same shape out, no routing), else None."""
    mlp = getattr(layer, "mlp", None)
    if mlp is None or any(name.split(".")[-1] in ("experts", "router") for name, _ in mlp.named_modules()):
        return None
    return mlp


def long_context_problems(model, parts: LongContext) -> list:
    """Why this model cannot run these parts, each with the fix; [] when it can."""
    lm = causal_lm(model)
    config = getattr(lm, "config", None)
    problems = []
    attention = getattr(config, "_attn_implementation", None)
    if attention is not None and attention not in LINEAR_MEMORY_ATTENTION:
        problems.append(f"long_context: attn_implementation {attention!r} builds seq x seq attention scores, so memory "
                        f"grows with the square of the sequence. Fix: load with attn_implementation='sdpa' (or "
                        f"'flash_attention_2'), or call model.set_attn_implementation('sdpa').")
    layers = decoder_layers(lm)
    if (parts.tiled_mlp or parts.offload_activations) and not layers:
        problems.append(f"long_context: {type(lm).__name__} has no transformers decoder layers "
                        "(GradientCheckpointingLayer) to tile or checkpoint. Fix: long_context with tiled_mlp and "
                        "offload_activations false, or a transformers causal LM.")
    if parts.tiled_mlp:
        routed = sorted({type(getattr(layer, "mlp", layer)).__name__ for layer in layers if _dense_mlp(layer) is None})
        if routed:
            problems.append(f"long_context: tiled_mlp runs dense MLPs only; {', '.join(routed)} routes tokens to "
                            "experts (or has no .mlp). Fix: long_context={'tiled_mlp': False} for this model.")
    if parts.fused_loss:
        if getattr(lm, "get_output_embeddings", lambda: None)() is None:
            problems.append(f"long_context: fused_loss needs a causal LM head; {type(lm).__name__} has none. "
                            "Fix: long_context={'fused_loss': False}.")
        try:
            from trl.trainer.utils import add_fused_lm_head  # noqa: F401
        except ImportError:
            problems.append("long_context: fused_loss uses TRL's fused LM head, and TRL (>= 1.16) is not installed. "
                            "Fix: pip install 'hf_zero[long]' (or 'trl>=1.16'), or long_context={'fused_loss': False}.")
    return problems


def enable_long_context(model, parts: LongContext | dict | bool = True, *, checked: bool = True) -> LongContext:
    """Turn on the long-context parts for ``model`` in place, before training. ``offload_activations`` moves what
    gradient checkpointing saves, so checkpointing must be on (ZeroCallback(long_context=...) turns it on).

    Raises ConfigError, before any change, when the model cannot run a part; ``checked=False`` leaves that to the
    caller (ZeroCallback's long-context check, which a user may skip)."""
    parts = LongContext.from_option(parts) or LongContext(False, False, False)
    lm = causal_lm(model)
    current = getattr(lm, _MARK, None)
    if current is not None:
        if current != parts:
            raise ConfigError(f"long_context is already on for this model with {current.as_dict()}; asked for "
                              f"{parts.as_dict()}. Fix: enable it once, with the parts you want.")
        return current
    problems = long_context_problems(lm, parts) if checked else []
    if problems:
        raise ConfigError(problems)
    if parts.tiled_mlp:
        for layer in decoder_layers(lm):
            _tile(_dense_mlp(layer))
    if parts.fused_loss:
        _fuse_loss(lm)
    if parts.offload_activations:
        _offload_layer_inputs(lm)
    setattr(lm, _MARK, parts)
    return parts


# ---- the parts ------------------------------------------------------------------------------
def _agreed_shards(x) -> int:
    """ceil(tokens / hidden) shards, the same on every rank: under ZeRO-3 each shard gathers the MLP's weights,
    and ranks with different counts would wait on each other's gathers forever."""
    import torch
    import torch.distributed as dist

    shards = max(1, math.ceil(x.shape[-2] / x.shape[-1]))
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        agreed = torch.tensor(shards, device=x.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        shards = int(agreed.item())
    return shards


def _tile(mlp) -> None:
    import torch

    TiledMLP = tiled_mlp()

    dense_forward = mlp.forward  # the class's forward, bound to this module
    weights = list(mlp.parameters())

    def tiled_forward(self, x):
        if not torch.is_grad_enabled():
            return dense_forward(x)  # no backward to save for: nothing is kept per token
        shards = _agreed_shards(x)
        if shards == 1:
            return dense_forward(x)
        # forward shards are slices along the sequence of [batch, seq, hidden]: with batch > 1 they are strided,
        # and MLPs that view their input (GPT-2's Conv1D) need them contiguous
        return TiledMLP.apply(lambda module, shard: dense_forward(shard.contiguous()), self, x, shards, weights)

    mlp.forward = types.MethodType(tiled_forward, mlp)


def _fuse_loss(lm) -> None:
    """TRL's fused head answers ``fused_lm_head=True``; the Trainer (and a user's loop) call the model without
    it, so training calls with labels ask for it. Evaluation and generation keep the model's own forward."""
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(lm)
    fused_forward = lm.forward

    def forward(self, *args, **kwargs):
        if self.training and "fused_lm_head" not in kwargs and (
                kwargs.get("labels") is not None or kwargs.get("shift_labels") is not None):
            kwargs["fused_lm_head"] = True
        return fused_forward(*args, **kwargs)

    functools.update_wrapper(forward, type(lm).forward)  # the Trainer reads loss kwargs off the signature
    lm.forward = types.MethodType(forward, lm)


def _offload_layer_inputs(lm) -> None:
    """Each checkpoint call runs inside the host offload: the checkpoint saves its layer's input for backward
    (reentrant: save_for_backward; non-reentrant: its saved inputs), and the offload's pack hook moves that copy to
    host memory. The recompute in backward runs outside it, so one recomputed layer's activations stay on the GPU.
    transformers installs the checkpoint function when training starts (gradient_checkpointing_enable), so the
    model's installer is wrapped, and a function already installed is wrapped now."""
    install = lm._set_gradient_checkpointing

    def set_gradient_checkpointing(enable=True, gradient_checkpointing_func=None, **kwargs):
        if gradient_checkpointing_func is not None:
            kwargs["gradient_checkpointing_func"] = offloaded(gradient_checkpointing_func)
        return install(enable, **kwargs)

    lm._set_gradient_checkpointing = set_gradient_checkpointing
    for layer in decoder_layers(lm):
        installed = getattr(layer, "_gradient_checkpointing_func", None)
        if installed is not None:
            layer._gradient_checkpointing_func = offloaded(installed)
