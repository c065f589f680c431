"""LoRA / PEFT adapters under DeepSpeed ZeRO-3: save the trained adapter (checked), merge it into its base.

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
import subprocess
import sys
import tempfile
from pathlib import Path

from ..distributed import from_rank0, is_distributed, launcher_free_env
from ..errors import CheckpointError
from ..modeling import adapter_folder, adapter_params, is_peft_model, is_trainer, unwrap_model
from ..zero3.gathering import gathered_params
from .saved_models import ADAPTER_CONFIG, adapter_problems, saved_model_problems


def adapter_state_dict(model, adapter_name: str = "default") -> dict:
    """The adapter's tensors, full and on the CPU, named as in ``model.named_parameters()``.

    A collective under ZeRO-3 (every rank must call it); gathers only the adapter, never the base.
    """
    model = unwrap_model(model)
    params = adapter_params(model, adapter_name)
    with gathered_params([p for _, p in params]):
        return {name: p.detach().to("cpu", copy=True) for name, p in params}


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def save_adapter(trainer_or_model, out_dir, *, adapter_name: str = "default", check: bool = True) -> Path:
    """Write the trained adapter (adapter_model.safetensors + adapter_config.json) that
    ``PeftModel.from_pretrained(base, out_dir)`` reloads; every rank calls it.

    Gathers the adapter's ZeRO-3 partitions, writes from rank 0 only (also the tokenizer when a
    Trainer with a processing_class is given), then checks the folder and raises CheckpointError on
    every rank if the saved adapter would not reload with the trained weights' shapes.
    """
    model = unwrap_model(trainer_or_model)
    if not is_peft_model(model):
        raise TypeError(f"save_adapter needs a peft PeftModel, got {type(model).__name__}; "
                        "for a full model use trainer.save_model().")
    out_dir = Path(out_dir)
    main = not is_distributed() or _rank() == 0
    state = adapter_state_dict(model, adapter_name)
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
        # peft maps our names to its file names (drops ".default") and writes adapter_config.json
        model.save_pretrained(str(out_dir), state_dict=state, selected_adapters=[adapter_name], safe_serialization=True)
        processing_class = getattr(trainer_or_model, "processing_class", None) if is_trainer(trainer_or_model) else None
        if processing_class is not None:
            processing_class.save_pretrained(str(out_dir))
    problems = adapter_problems(adapter_folder(out_dir, adapter_name), model, adapter_name) if main and check else []
    problems = from_rank0(problems)  # every rank raises together, none waits forever
    if problems:
        raise CheckpointError("hf_zero: saved adapter will not reload: " + " ".join(problems))
    return out_dir


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
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled() or is_distributed()


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
        raise CheckpointError("hf_zero: cannot merge: " + " ".join(problems))
    if base_model is None:
        base_model = json.loads((adapter_dir / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
        if not base_model:
            raise CheckpointError(f"{adapter_dir / ADAPTER_CONFIG} names no base model; pass base_model=.")
    out_dir = Path(out_dir if out_dir is not None else adapter_dir.with_name(adapter_dir.name + "_merged"))
    if in_subprocess is None:
        in_subprocess = _needs_clean_process()
    folder = tempfile.TemporaryDirectory(prefix="hf_zero_merge_config_") if config is not None else contextlib.nullcontext()
    with folder as config_dir:
        if config_dir:
            config.save_pretrained(config_dir)  # a file, so a clean merge process can read it too
        if in_subprocess:
            env = launcher_free_env()
            cmd = [sys.executable, "-m", "hf_zero.checkpoints.adapters", str(adapter_dir), str(base_model), str(out_dir),
                   "--dtype", str(dtype)] + (["--config", config_dir] if config_dir else [])
            proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise CheckpointError(f"hf_zero: merge failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
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
    problems = saved_model_problems(out_dir, merged)
    if problems:
        raise CheckpointError("hf_zero: merged model will not reload: " + " ".join(problems))
    return out_dir


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m hf_zero.checkpoints.adapters", description="Merge a LoRA adapter into its base model.")
    p.add_argument("adapter_dir")
    p.add_argument("base_model")
    p.add_argument("out_dir")
    p.add_argument("--dtype", default="auto", help="auto (the checkpoint's), float32, bfloat16, float16")
    p.add_argument("--config", help="folder with the fine-tuned model's config.json (its class and head)")
    a = p.parse_args(argv)
    _merge(Path(a.adapter_dir), a.base_model, Path(a.out_dir), a.dtype, a.config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
