"""LoRA / PEFT adapters under DeepSpeed ZeRO-3: save the trained adapter, check it, merge it.

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path), LoraConfig(...))  # after TrainingArguments
    trainer = Trainer(model=model, args=args, ...); hf_zero.attach(trainer); trainer.train()
    hf_zero.lora.save_adapter(trainer, "out/adapter")              # every rank calls it (a gather)
    if trainer.is_world_process_zero():
        hf_zero.lora.merge_and_save("out/adapter", path, "out/merged")  # a full model folder

Under ZeRO-3 a LoRA tensor can be a partition (numel 0) on every rank; ``model.save_pretrained``
then writes zero-size tensors with only a warning, and ``PeftModel.from_pretrained`` fails later
with size mismatches. ``save_adapter`` gathers the adapter's tensors (and only those), writes
them from rank 0 and checks what it wrote. ``merge_and_save`` merges on the CPU in a process with
no DeepSpeed config, so the merged weights are exactly what peft's ``merge_and_unload`` computes.
"""

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .saving import gathered_params

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# DeepSpeed PR #8148 (in 0.19.3): before it, ZeRO-3 re-partitioned frozen parameters during a
# non-reentrant checkpoint recompute and torch raised CheckpointError (seen here with 0.19.2).
FROZEN_RECOMPUTE_FIX = "0.19.3"
_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "NODE_RANK",
                  "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def is_peft_model(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(unwrap_model(model), PeftModel)


def unwrap_model(model):
    """The user's model from a Trainer, a DeepSpeedEngine or the model itself."""
    model = getattr(model, "model", model) if _is_trainer(model) else model
    return getattr(model, "module", model)  # DeepSpeedEngine / DDP keep the model in .module


def _is_trainer(obj) -> bool:
    return hasattr(obj, "args") and hasattr(obj, "model_wrapped")


def _adapter_params(model, adapter_name: str) -> list:
    """(name, param) of what peft saves for ``adapter_name``: its LoRA tensors and modules_to_save copies."""
    marker = f".{adapter_name}."
    return [(n, p) for n, p in model.named_parameters() if marker in n and (p.requires_grad or "lora_" in n
                                                                            or "modules_to_save" in n)]


def adapter_state_dict(model, adapter_name: str = "default") -> dict:
    """The adapter's tensors, full and on the CPU, named as in ``model.named_parameters()``.

    A collective under ZeRO-3 (every rank must call it); gathers only the adapter, never the base.
    """
    model = unwrap_model(model)
    params = _adapter_params(model, adapter_name)
    with gathered_params([p for _, p in params]):
        return {name: p.detach().to("cpu", copy=True) for name, p in params}


def save_adapter(trainer_or_model, out_dir, *, adapter_name: str = "default", check: bool = True) -> Path:
    """Write the trained adapter (adapter_model.safetensors + adapter_config.json) that
    ``PeftModel.from_pretrained(base, out_dir)`` reloads; every rank calls it.

    Gathers the adapter's ZeRO-3 partitions, writes from rank 0 only (also the tokenizer when a
    Trainer with a processing_class is given), then checks the folder and raises RuntimeError on
    every rank if the saved adapter would not reload with the trained weights' shapes.
    """
    import torch.distributed as dist

    model = unwrap_model(trainer_or_model)
    if not is_peft_model(model):
        raise TypeError(f"save_adapter needs a peft PeftModel, got {type(model).__name__}; "
                        "for a full model use trainer.save_model().")
    out_dir = Path(out_dir)
    distributed = dist.is_available() and dist.is_initialized()
    main = not distributed or dist.get_rank() == 0
    state = adapter_state_dict(model, adapter_name)
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
        # peft maps our names to its file names (drops ".default") and writes adapter_config.json
        model.save_pretrained(str(out_dir), state_dict=state, selected_adapters=[adapter_name], safe_serialization=True)
        processing_class = getattr(trainer_or_model, "processing_class", None) if _is_trainer(trainer_or_model) else None
        if processing_class is not None:
            processing_class.save_pretrained(str(out_dir))
    problems = adapter_problems(_adapter_folder(out_dir, adapter_name), model, adapter_name) if main and check else []
    if distributed:
        shared = [problems]
        dist.broadcast_object_list(shared, src=0)  # every rank raises together, none waits forever
        problems = shared[0]
    if problems:
        raise RuntimeError("hf_zero: saved adapter will not reload: " + " ".join(problems))
    return out_dir


def _adapter_folder(out_dir: Path, adapter_name: str) -> Path:
    # peft writes adapters other than "default" into a sub-folder of that name
    return out_dir if adapter_name == "default" else out_dir / adapter_name


def _adapter_key(param_name: str, adapter_name: str) -> str:
    """named_parameters() name -> the key peft writes (the adapter name is dropped)."""
    return param_name.replace(f".{adapter_name}.", ".").replace(".modules_to_save.", ".")


def is_adapter_folder(folder) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).exists()


def adapter_problems(folder, model=None, adapter_name: str = "default") -> list:
    """What would stop ``PeftModel.from_pretrained(base, folder)`` from giving back the trained
    adapter; [] if nothing. With ``model`` (the PeftModel, partitioned or not) it also checks
    that every adapter tensor is there with its full shape.
    """
    from .saving import full_shapes

    folder = Path(folder)
    problems = []
    if not (folder / ADAPTER_CONFIG).exists():
        problems.append(f"{folder}: no {ADAPTER_CONFIG}.")
    weights = folder / ADAPTER_WEIGHTS
    if not weights.exists():
        return problems + [f"{folder}: no {ADAPTER_WEIGHTS}."]
    try:
        from safetensors import safe_open

        with safe_open(weights, framework="pt") as f:
            saved = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    except Exception as e:  # truncated or corrupt: name the folder, not a traceback
        return problems + [f"{folder}: unreadable {ADAPTER_WEIGHTS} ({e})."]
    if not saved:
        return problems + [f"{folder}: {ADAPTER_WEIGHTS} holds no tensors."]
    empty = [name for name, shape in saved.items() if 0 in shape]
    if empty:
        problems.append(f"{folder}: {len(empty)} of {len(saved)} adapter tensors are zero-size (e.g. {empty[0]}): "
                        "ZeRO-3 partitions were saved, not gathered weights. Fix: hf_zero.lora.save_adapter(trainer, dir) "
                        "or trainer.save_model(dir) instead of model.save_pretrained(dir).")
    if model is not None:
        model = unwrap_model(model)
        shapes = full_shapes(model)
        expected = {_adapter_key(n, adapter_name): shapes[n] for n, _ in _adapter_params(model, adapter_name)}
        missing = sorted(set(expected) - set(saved))
        if missing:
            problems.append(f"{folder}: {len(missing)} adapter tensors missing (e.g. {missing[0]}).")
        wrong = [k for k in expected if k in saved and saved[k] != expected[k] and 0 not in saved[k]]
        if wrong:
            problems.append(f"{folder}: {wrong[0]} has shape {saved[wrong[0]]}, the model has {expected[wrong[0]]}.")
    return problems


def has_frozen_parameters(module) -> bool:
    """Whether some parameter does not train (LoRA, adapters, a frozen tower). By requires_grad, not numel:
    under zero.Init a parameter's numel() is its partition's, 0 on most ranks."""
    return any(not p.requires_grad for p in module.parameters())


def no_leaf_modules_with_frozen_weights(model, config: dict) -> str | None:
    """Under ZeRO-3, set ``stage3_module_granularity_threshold`` to 0 in ``config`` (the live dict the engine is
    built from) when the model has frozen parameters; returns a note, or None when nothing changed.

    The threshold makes DeepSpeed turn modules into ZeRO-3 leaves, and DeepSpeed 0.19.8 loses a leaf's frozen
    weights before their backward: with the zero3 preset (threshold 5e6) a PEFT LoRA 1.35B Llama failed at the
    first backward on 2x H200 (RuntimeError: output with shape [1] doesn't match the broadcast shape [2048, 16]),
    and trained with the threshold at 0 (hf_zero/bench/results/2xH200/sweeps)."""
    from .rules import LEAF_THRESHOLD

    zero = config.get("zero_optimization") or {}
    threshold = zero.get(LEAF_THRESHOLD, 0)
    if zero.get("stage") != 3 or not isinstance(threshold, (int, float)) or threshold <= 0:
        return None
    if not has_frozen_parameters(model):
        return None
    zero[LEAF_THRESHOLD] = 0
    return (f"{LEAF_THRESHOLD} set to 0 (was {threshold:g}): the model has frozen parameters (LoRA/adapters), and "
            "DeepSpeed loses a ZeRO-3 leaf module's frozen weights before their backward (RuntimeError: output with "
            "shape [1] doesn't match the broadcast shape ...); each Linear is fetched on its own instead")


def adapters_to_training_dtype(model, dtype) -> str | None:
    """Under ZeRO-3, cast the fp32 trainable tensors of a model with a ``dtype`` (16-bit) frozen base to ``dtype``,
    as DeepSpeed's ZeRO-1/2 engine casts the whole model; returns a note, or None when nothing changed.

    peft keeps LoRA adapters fp32, and DeepSpeed's ZeRO-3 engine partitions them as they are. peft then
    casts each adapted Linear's 16-bit input to fp32 and the adapter keeps that copy for its backward:
    with LoRA on every Linear of a 1.35B Llama, 6.52 GiB of a 20.16 GiB peak per GPU on 2 ranks; 13.66 GiB
    with the adapters in bf16 (hf_zero/bench/results/1xH200/simulated_ranks/1.35b_lora_variants*). DeepSpeed's
    optimizer keeps fp32 master weights of the adapters either way; ZeRO-2 trains them in 16 bits too."""
    import torch

    frozen = [p for p in model.parameters() if not p.requires_grad]
    # a zero.Init parameter's data is empty; its dtype is still the partition's
    if not frozen or any(p.dtype != dtype for p in frozen if p.is_floating_point()):
        return None
    cast = [p for p in model.parameters() if p.requires_grad and p.dtype == torch.float32 and not hasattr(p, "ds_id")]
    if not cast:
        return None
    for param in cast:
        param.data = param.data.to(dtype)
    count = sum(p.numel() for p in cast)
    return (f"cast {len(cast)} trainable fp32 tensors ({count / 1e6:.1f}M parameters: LoRA/adapters) to {dtype}, the "
            "frozen base's dtype, as ZeRO-1/2 do: ZeRO-3 would train them in fp32 and peft would keep an fp32 copy of "
            "every adapted layer's input (LoRA on every Linear of a 1.35B Llama: 20.16 GiB per GPU, 13.66 cast). "
            "The optimizer still keeps fp32 masters. To keep them fp32: hf_zero.attach(trainer, cast_adapters=False)")


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
            "faster and lighter for adapters. On 2x H200 a LoRA 1.35B Llama ran 71.0k tokens/s at 10.57 GiB with "
            "the zero2 preset and 15.1-16.8k at 15.04 GiB with zero3 and fp32 adapters (hf_zero/bench/results/2xH200/sweeps; "
            "13.54 GiB with the bf16 adapters hf_zero now gives ZeRO-3). "
            "Fix: --deepspeed recipes/zero2.json")


def checkpointing_problems(model, args, deepspeed_version: str | None = None) -> list:
    """Why gradient checkpointing of this PEFT model would crash under ZeRO-3; [] if it will not.

    DeepSpeed before 0.19.3 re-partitions frozen parameters inside a non-reentrant recompute and
    torch raises ``CheckpointError: Recomputed values ... saved [64] vs recomputed [0]``.
    """
    from packaging.version import Version

    from .callback import _checkpointing_kwargs, _checkpointing_on, deepspeed_config_of
    from .presets import get_dotted

    config = deepspeed_config_of(args) or {}
    if not _checkpointing_on(args) or get_dotted(config, "zero_optimization.stage", 0) != 3:
        return []
    if (_checkpointing_kwargs(args) or {}).get("use_reentrant", False):
        return []  # the reentrant path does not compare recomputed tensors
    if not has_frozen_parameters(unwrap_model(model)):
        return []  # full fine-tuning
    if deepspeed_version is None:
        import deepspeed

        deepspeed_version = deepspeed.__version__
    if Version(deepspeed_version) >= Version(FROZEN_RECOMPUTE_FIX):
        return []
    return [(f"DeepSpeed {deepspeed_version} re-partitions frozen parameters during a non-reentrant gradient-checkpointing "
             "recompute under ZeRO-3, and backward fails with torch CheckpointError (saved vs recomputed shape [0]). "
             f"Fix: pip install 'deepspeed>={FROZEN_RECOMPUTE_FIX}', or pass gradient_checkpointing_kwargs="
             "{'use_reentrant': True} (transformers makes the embeddings' output require grad, so LoRA layers "
             "inside reentrant checkpoints still get gradients; same losses with DeepSpeed 0.19.2 here).")]


def _base_class(architectures):
    """The class a model was saved as (config.architectures), so the merge loads its exact head."""
    import transformers

    for arch in architectures or []:
        if hasattr(transformers, arch):
            return getattr(transformers, arch)
    return transformers.AutoModelForCausalLM


def _needs_clean_process() -> bool:
    """A live HF DeepSpeed config makes from_pretrained enter zero.Init (a collective: hangs on one rank);
    a launched process group would do the same."""
    import torch.distributed as dist
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled() or (dist.is_available() and dist.is_initialized())


def merge_and_save(adapter_dir, base_model=None, out_dir=None, *, dtype="auto", config=None, in_subprocess=None) -> Path:
    """Merge a saved adapter into its base model and write a full model folder (safetensors)
    that ``from_pretrained(out_dir)`` loads; call it on one process only.

    ``base_model`` is the base model's folder (default: adapter_config.json's
    base_model_name_or_path). The merge runs on the CPU without any DeepSpeed config, in a fresh
    process when this one has one (or a process group), so the merged weights equal peft's own
    ``merge_and_unload``. The tokenizer saved with the adapter, else the base's, is copied along.
    ``config`` (a transformers config) is the fine-tuned model's, for a fine-tune that added a head
    the base lacks (a classifier on a bare encoder): the base is loaded as ``config.architectures[0]``
    with that config, and the adapter's saved head replaces the new one.
    """
    adapter_dir = Path(adapter_dir)
    problems = adapter_problems(adapter_dir)
    if problems:
        raise ValueError("hf_zero: cannot merge: " + " ".join(problems))
    if base_model is None:
        base_model = json.loads((adapter_dir / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
        if not base_model:
            raise ValueError(f"{adapter_dir / ADAPTER_CONFIG} names no base model; pass base_model=.")
    out_dir = Path(out_dir if out_dir is not None else adapter_dir.with_name(adapter_dir.name + "_merged"))
    if in_subprocess is None:
        in_subprocess = _needs_clean_process()
    folder = tempfile.TemporaryDirectory(prefix="hf_zero_merge_config_") if config is not None else contextlib.nullcontext()
    with folder as config_dir:
        if config_dir:
            config.save_pretrained(config_dir)  # a file, so a clean merge process can read it too
        if in_subprocess:
            env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS and not k.startswith("ACCELERATE_")}
            cmd = [sys.executable, "-m", "hf_zero.lora", str(adapter_dir), str(base_model), str(out_dir),
                   "--dtype", str(dtype)] + (["--config", config_dir] if config_dir else [])
            proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"hf_zero: merge failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
            return out_dir
        return _merge(adapter_dir, str(base_model), out_dir, dtype, config_dir)


def _merge(adapter_dir: Path, base_model: str, out_dir: Path, dtype, config_dir=None) -> Path:
    import torch
    from peft import PeftModel

    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    from transformers import AutoConfig

    # the fine-tuned model's config (class and head) when given, else the base's own
    config = AutoConfig.from_pretrained(config_dir or base_model)
    base = _base_class(config.architectures).from_pretrained(base_model, config=config, dtype=dtype)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    out_dir.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out_dir), safe_serialization=True)
    for source in (adapter_dir, Path(base_model)):
        if (source / "tokenizer_config.json").exists():
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(out_dir))
            break
    from .saving import saved_model_problems

    problems = saved_model_problems(out_dir, merged)
    if problems:
        raise RuntimeError("hf_zero: merged model will not reload: " + " ".join(problems))
    return out_dir


def _main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m hf_zero.lora", description="Merge a LoRA adapter into its base model.")
    p.add_argument("adapter_dir")
    p.add_argument("base_model")
    p.add_argument("out_dir")
    p.add_argument("--dtype", default="auto", help="auto (the checkpoint's), float32, bfloat16, float16")
    p.add_argument("--config", help="folder with the fine-tuned model's config.json (its class and head)")
    a = p.parse_args(argv)
    _merge(Path(a.adapter_dir), a.base_model, Path(a.out_dir), a.dtype, a.config)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
