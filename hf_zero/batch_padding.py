"""Batch padding on GPUs: aligned widths run faster than batches padded only to their longest sample.

Measured with variable-length batches (1.35B Llama-like model, one H200, zero2 preset, samples of 256-1024
tokens; benchmarks/1xH200/sweeps/variable_length.json and offload_gc_lora_padding.json), in real
tokens/s: padded to the longest sample 8.9k, to a multiple of 8 9.7k, of 64 11.7k; with regional
torch.compile 11.4k, 13.5k and 17.0k. The extra padding (32% of the batch against 29%) is paid for.
"""

GPU_PAD_MULTIPLE = 64


def padding_advice(collator, on_gpu: bool) -> str | None:
    """A note when a transformers padding collator pads each batch only to its longest sample on a GPU;
    None to stay quiet (no GPU, no padding collator, fixed-length padding, or already a multiple)."""
    if not on_gpu or not hasattr(collator, "pad_to_multiple_of"):
        return None
    if collator.pad_to_multiple_of or getattr(collator, "padding", True) in ("max_length", False, "do_not_pad"):
        return None
    return (f"{type(collator).__name__} pads each batch to its longest sample, so every batch has a new, unaligned "
            f"width. On GPUs pad_to_multiple_of={GPU_PAD_MULTIPLE} trains more real tokens per second, eager and "
            f"more so with regional torch.compile (measured: hf_zero's docs, performance.md). Fix: "
            f"{type(collator).__name__}(tokenizer, pad_to_multiple_of={GPU_PAD_MULTIPLE})")
