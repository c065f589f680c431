"""LoRA / PEFT under ZeRO-3: what a frozen base needs before the engine exists, and when ZeRO-2 is the better fit."""

from ..config.live import no_leaf_modules
from ..modeling import has_frozen_parameters
from ..zero3.partitions import is_zero3_param


def no_leaf_modules_with_frozen_weights(model, config: dict, version: str | None = None) -> str | None:
    """Under ZeRO-3, set ``stage3_module_granularity_threshold`` to 0 in ``config`` (the live dict the engine is
    built from) when the model has frozen parameters and the DeepSpeed release (``version``, default the installed
    one) is not one hf_zero's leaf-inputs fix covers; returns a note, or None when nothing changed.

    DeepSpeed reduces a leaf's gradients before the leaf's backward when none of its inputs needs a gradient, as
    after frozen weights (hf_zero.zero3.leaves.leaf_inputs_require_grad): the first backward then stops
    (RuntimeError: output with shape [1] doesn't match the broadcast shape ...). Where that fix applies, leaves
    stay; elsewhere the threshold's leaves go."""
    from ..compat.deepspeed_api import leaf_inputs_fix_covers

    if not has_frozen_parameters(model) or leaf_inputs_fix_covers(version):
        return None
    return no_leaf_modules(config, because="the model has frozen parameters (LoRA/adapters), and on this DeepSpeed "
                           "release a ZeRO-3 leaf after frozen weights has its gradients reduced before its backward "
                           "(RuntimeError: output with shape [1] doesn't match the broadcast shape ...); each Linear is "
                           "fetched on its own instead")


def adapters_to_training_dtype(model, dtype) -> str | None:
    """Under ZeRO-3, cast the fp32 trainable tensors of a model with a ``dtype`` (16-bit) frozen base to ``dtype``,
    as DeepSpeed's ZeRO-1/2 engine casts the whole model; returns a note, or None when nothing changed.

    peft keeps LoRA adapters fp32, and DeepSpeed's ZeRO-3 engine partitions them as they are. peft then
    casts each adapted Linear's 16-bit input to fp32 and the adapter keeps that copy for its backward:
    with LoRA on every Linear of a 1.35B Llama, 6.52 GiB of a 20.16 GiB peak per GPU on 2 ranks; 13.66 GiB
    with the adapters in bf16 (benchmarks/1xH200/simulated_ranks/1.35b_lora_variants*). DeepSpeed's
    optimizer keeps fp32 master weights of the adapters either way; ZeRO-2 trains them in 16 bits too."""
    import torch

    frozen = [p for p in model.parameters() if not p.requires_grad]
    # a zero.Init parameter's data is empty; its dtype is still the partition's
    if not frozen or any(p.dtype != dtype for p in frozen if p.is_floating_point()):
        return None
    cast = [p for p in model.parameters() if p.requires_grad and p.dtype == torch.float32 and not is_zero3_param(p)]
    if not cast:
        return None
    for param in cast:
        param.data = param.data.to(dtype)
    count = sum(p.numel() for p in cast)
    return (f"cast {len(cast)} trainable fp32 tensors ({count / 1e6:.1f}M parameters: LoRA/adapters) to {dtype}, the "
            "frozen base's dtype, as ZeRO-1/2 do: ZeRO-3 would train them in fp32 and peft would keep an fp32 copy of "
            "every adapted layer's input (LoRA on every Linear of a 1.35B Llama: 20.16 GiB per GPU, 13.66 cast). "
            "The optimizer still keeps fp32 masters. To keep them fp32: cast_adapters=False (ZeroCallback, "
            "hf_zero.attach or hf_zero.prepare)")


# A 16-bit base below this share of one GPU leaves room for ZeRO-2's activations and buckets (the
# measured LoRA runs: a 1.35B base, 2.5 GiB of 141 GiB, peaked at 10.57 GiB under the zero2 preset)
ZERO2_BASE_SHARE = 0.25


def zero2_advice(base_params: int, gpu_bytes: int | None) -> str | None:
    """A note when a LoRA run under ZeRO-3 would fit ZeRO-2, which is faster and lighter for adapters: their
    optimizer states are tiny, so ZeRO-3 shards little and adds a fetch per frozen Linear. None to stay quiet
    (the base is large for the GPU, or there is no GPU to compare with)."""
    if not gpu_bytes or 2 * base_params > ZERO2_BASE_SHARE * gpu_bytes:
        return None
    return (f"LoRA under ZeRO-3 with a base of {base_params / 1e9:.2f}B parameters ({2 * base_params / 1024**3:.1f} GiB "
            f"in 16 bits, {gpu_bytes / 1024**3:.0f} GiB per GPU): ZeRO-2 holds the whole base on each GPU and is "
            "faster and lighter for adapters (measured: hf_zero's docs, lora.md). "
            "Fix: --deepspeed recipes/zero2.json")
