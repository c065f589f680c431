"""ZeRO checkpoint -> Hugging Face model folder (sharded safetensors + index, config, tokenizer).

The weights are DeepSpeed's own consolidation (``get_fp32_state_dict_from_zero_checkpoint``)
in lazy mode: each tensor is assembled from the rank partitions only when its shard is
written, so host memory holds the memory-mapped fp32 partitions plus one output shard,
not a second full copy of the model.
"""

import contextlib
import io
import json
import os
import shutil
import sys
from pathlib import Path

from ..compat.deepspeed_api import (fp32_state_dict_from_zero_checkpoint, materialized_zero_tensors,
                                    zero_to_fp32_converts_dtype)
from ..errors import CheckpointError, ConfigError
from ..output_paths import refuse_overlaps
from .folders import checkpoint_within, ensure_complete, find_zero_checkpoint, shape_mismatches
from .safe_load import guard_deepspeed_loads

DTYPES = ("bf16", "fp16", "fp32")
_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# Files a Trainer checkpoint carries besides the weights that belong in a model folder.
_MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                "special_tokens_map.json", "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt",
                "chat_template.jinja", "chat_template.json", "preprocessor_config.json", "processor_config.json")


def _progress(message: str) -> None:
    print(f"hf-zero export: {message}", file=sys.stderr, flush=True)


def _check_output(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out} exists and is not a folder; pick another output folder.")
    if not (out.is_dir() and any(out.iterdir())):
        return
    # replacing OUT deletes what it holds: a checkpoint there is refused even with --overwrite
    held = checkpoint_within(out)
    if held is not None:
        raise CheckpointError(f"{out} holds a checkpoint ({held}); nothing was written, and --overwrite never deletes "
                              "a checkpoint. Pick another output folder, or move the checkpoint out of it first.")
    if not overwrite:
        raise CheckpointError(f"{out} exists and is not empty; nothing was written. Pick an empty folder or pass "
                          "--overwrite to replace it (it is replaced only after the export succeeds).")


def _lazy_state_dict(root: Path, tag: str, trust: bool):
    """DeepSpeed's consolidation, lazily, with its chatter kept off stdout."""
    with guard_deepspeed_loads(trust=trust), contextlib.redirect_stdout(io.StringIO()):
        return fp32_state_dict_from_zero_checkpoint(str(root), tag)


def _drop_aliases(state_dict: dict) -> list:
    """Tied weights come back as one tensor under two names; keep the first, as save_pretrained does.

    from_pretrained re-ties the dropped name (e.g. lm_head.weight) from the model's config.
    """
    seen, dropped = set(), []
    for name in list(state_dict):
        key = id(state_dict[name])
        if key in seen:
            dropped.append(name)
            del state_dict[name]
        seen.add(key)
    return dropped


def zero_checkpoint_tensors(state_dict: dict, dtype: str, sizes_only: bool = False) -> dict:
    """zero_to_fp32's lazily gathered tensors, materialized (or, ``sizes_only``, as empty tensors of their size) in
    ``dtype`` (bf16 / fp16 / fp32); integer buffers keep their dtype, and tensors shared under two names stay one
    tensor. DeepSpeed converts while it materializes where its release can; otherwise the same conversion happens
    here, after DeepSpeed's own materialization."""
    if zero_to_fp32_converts_dtype():
        return materialized_zero_tensors(state_dict, sizes_only, dtype=dtype)
    return _converted(materialized_zero_tensors(state_dict, sizes_only), dtype)


def _converted(tensors: dict, dtype: str) -> dict:
    """``tensors`` with every floating-point tensor in ``dtype``, one conversion per shared tensor."""
    import torch

    target = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    converted = {}
    for name, tensor in tensors.items():
        if id(tensor) not in converted:
            converted[id(tensor)] = tensor.to(target) if tensor.dtype.is_floating_point else tensor
        tensors[name] = converted[id(tensor)]
    return tensors


def _write_shards(state_dict: dict, out: Path, dtype: str, max_shard_size) -> int:
    """Write sharded safetensors (and an index when there is more than one); returns the shard count."""
    import gc

    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    # DeepSpeed's own converter takes the names (bf16 / fp16 / fp32) and leaves integer buffers as they are
    sizes_only = zero_checkpoint_tensors(state_dict, dtype, sizes_only=True)
    split = split_torch_state_dict_into_shards(sizes_only, filename_pattern="model{suffix}.safetensors",
                                               max_shard_size=max_shard_size)
    del sizes_only
    shards = list(split.filename_to_tensors.items())
    for i, (filename, names) in enumerate(shards, 1):
        shard = zero_checkpoint_tensors({n: state_dict[n] for n in names}, dtype)
        save_file(shard, str(out / filename), metadata={"format": "pt"})
        for n in names:
            del state_dict[n]  # the lazy tensor and its materialized copy go before the next shard
        del shard
        gc.collect()
        _progress(f"wrote {filename} ({i}/{len(shards)})")
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return len(shards)


def _copy_model_files(sources: list, out: Path) -> list:
    copied = []
    for name in _MODEL_FILES:
        src = next((s / name for s in sources if (s / name).is_file()), None)
        if src is not None:
            shutil.copy2(src, out / name)
            copied.append(name)
    return copied


def _set_config_dtype(out: Path, dtype: str) -> None:
    """config.json says the dtype the weights are in, so dtype="auto" loads them as written."""
    config_file = out / "config.json"
    if not config_file.exists():
        return
    config = json.loads(config_file.read_text())
    name = _DTYPE_NAMES[dtype]
    for key in ("dtype", "torch_dtype"):
        if key in config or key == "dtype":
            config[key] = name
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def trained_dtype(sources: list) -> str:
    """The dtype the run trained in, as the checkpoint's config.json says (fp32 when it says nothing)."""
    config_file = next((s / "config.json" for s in sources if (s / "config.json").is_file()), None)
    config = json.loads(config_file.read_text()) if config_file is not None else {}
    named = config.get("dtype") or config.get("torch_dtype")
    return next((short for short, name in _DTYPE_NAMES.items() if name == named), "fp32")


def export(checkpoint, out, *, dtype: str | None = None, max_shard_size="5GB", overwrite: bool = False,
           trust_checkpoint: bool = False, config_dir=None) -> dict:
    """Export a ZeRO checkpoint (any stage, any world size) to a from_pretrained model folder.

    ``dtype`` (bf16 / fp16 / fp32) converts; by default the weights keep the precision the run trained in
    (config.json's dtype), so they equal the engine's. Refuses, before writing anything, a folder that is not a checkpoint, one with missing or
    truncated rank files, a pickle that would run code (unless ``trust_checkpoint``), a
    non-empty ``out`` (unless ``overwrite``), an ``out`` that is, contains or lies inside the checkpoint, and an ``out``
    holding a checkpoint (never deleted, ``overwrite`` or not). The export is built in a temporary folder beside
    ``out`` and moved into place only when complete, so a failure never leaves a half-written
    model where a good one was.
    """
    checkpoint, out = Path(checkpoint), Path(out)
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}.")
    if not checkpoint.is_dir():
        raise CheckpointError(f"{checkpoint} is not a folder. Pass a Trainer checkpoint-N/ folder or a DeepSpeed save folder.")
    refuse_overlaps({"OUT": out}, {"CHECKPOINT": checkpoint, "--config": config_dir})
    _check_output(out, overwrite)
    zero = find_zero_checkpoint(checkpoint)
    if zero is None:
        raise CheckpointError(f"{checkpoint} holds no DeepSpeed ZeRO checkpoint (no global_step*/ folder and no 'latest' "
                          "file). Pass the checkpoint-N/ folder the Trainer wrote, or the global_stepN/ folder in it.")
    # given its global_stepN/, the checkpoint is the folder around it (config.json, latest)
    refuse_overlaps({"OUT": out}, {"the checkpoint folder": zero.root})
    ensure_complete(zero, checkpoint, trust=trust_checkpoint, refused="cannot be exported",
                    remedy="Export an earlier complete checkpoint (hf-zero verify tells which are).")
    if zero.universal:
        raise CheckpointError(f"{zero.tag_dir} is a universal checkpoint (for resuming on another world size); export the "
                          "original global_stepN/ folder it was converted from.")
    sources = [Path(config_dir)] if config_dir else []
    sources += [zero.root, zero.root.parent] if zero.root != checkpoint else [checkpoint]
    if not any((s / "config.json").is_file() for s in sources):
        raise CheckpointError(f"no config.json next to {checkpoint}: pass --config DIR (the model folder the run started "
                          "from) so the export is a loadable model folder.")

    dtype = dtype or trained_dtype(sources)
    _progress(f"consolidating {zero.tag} (ZeRO-{zero.stage}, {zero.dp_world_size} rank(s))")
    state_dict = _lazy_state_dict(zero.root, zero.tag, trust_checkpoint)
    dropped = _drop_aliases(state_dict)

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.exporting-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        copied = _copy_model_files(sources, staging)
        _set_config_dtype(staging, dtype)
        wrong = shape_mismatches(staging, {n: t.shape for n, t in state_dict.items()})
        if wrong:
            raise CheckpointError(f"the checkpoint does not match config.json: {'; '.join(wrong[:3])}. Pass --config with "
                              "the model folder this run trained.")
        n_tensors = len(state_dict)
        shards = _write_shards(state_dict, staging, dtype, max_shard_size)
        replace_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"checkpoint": str(zero.tag_dir), "out": str(out), "stage": zero.stage, "world_size": zero.dp_world_size,
            "dtype": dtype, "tensors": n_tensors, "shards": shards, "tied_dropped": dropped, "copied": copied}


def replace_folder(staging: Path, out: Path) -> None:
    """Move the finished export into place; an old ``out`` is removed only after the new one is there."""
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        staging.rename(out)
        shutil.rmtree(old)
    else:
        staging.rename(out)
