"""`hf-zero finetune`: fine-tune a pretrained model under DeepSpeed ZeRO with the HF Trainer.

    torchrun --nproc_per_node 2 -m hf_zero.finetune --model PATH --data reviews.csv \\
        --label_column category --preset zero3 --num_train_epochs 1 --output_dir out
Runs the same as plain `python -m hf_zero.finetune`, under `accelerate launch` and `deepspeed`.
Every TrainingArguments flag passes through.
"""

import copy
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from transformers import HfArgumentParser, Trainer

from ..config.presets import preset_name_of
from ..distributed import gpu_memory_bytes, has_gpu, is_main_process, name_cpu_accelerator, shutdown
from ..errors import HfZeroError
from ..output_paths import refuse_overlaps
from ..trainer.callback import attach
from ..trainer.training_args import TrainingArguments, accelerate_deepspeed_file
from .args import finetune_parser
from .task import build_task, check_model_source, load_model, load_tokenizer, summarise_metrics

# Defaults that make a fine-tune sensible out of the box; any flag given on the command line wins.
_TRAINER_DEFAULTS = {"output_dir": "finetune_out", "eval_strategy": "epoch", "eval_on_start": "true",
                     "logging_steps": "10", "save_strategy": "no", "report_to": "none", "seed": "0"}


def _default_preset(model: str, trust_remote_code: bool = False) -> str:
    """zero3 on CPU (memory is the limit there) and for models whose Adam states would crowd one GPU; else zero2."""
    if not has_gpu():
        return "zero3"
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModel

    with init_empty_weights():
        config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
        n = sum(p.numel() for p in AutoModel.from_config(config, trust_remote_code=trust_remote_code).parameters())
    return "zero3" if n * 16 > 0.5 * gpu_memory_bytes() else "zero2"


def parse(argv):
    ft, rest = finetune_parser().parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    given = {a.split("=")[0].lstrip("-") for a in rest if a.startswith("--")}
    defaults = [item for key, value in _TRAINER_DEFAULTS.items() if key not in given for item in (f"--{key}", value)]
    if ft.task == "classification" and "average_tokens_across_devices" not in given:
        # The Trainer multiplies the loss by the number of processes for models that take loss kwargs,
        # which is right for token-averaged LM losses and doubles a classifier's loss on 2 ranks.
        defaults += ["--average_tokens_across_devices", "false"]
    launched_with_config = accelerate_deepspeed_file()
    if launched_with_config and not ft.preset and "deepspeed" not in given:
        # accelerate launch --config_file YAML (hf-zero presets NAME --accelerate-config): its DeepSpeed config rules
        # (named for the report)
        ft.preset = launched_with_config if isinstance(launched_with_config, str) else \
            preset_name_of(launched_with_config) or "the Accelerate config's DeepSpeed config"
    elif "deepspeed" not in given:
        ft.preset = ft.preset or _default_preset(ft.model, ft.trust_remote_code)
        defaults += ["--deepspeed", ft.preset]
    check_model_source(ft)
    [args] = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(args=rest + defaults)
    refuse_overlaps({"--output_dir": args.output_dir}, _local_inputs(ft))
    return ft, args


def _local_inputs(ft) -> dict:
    """The local model folder and data files a run reads, which its output_dir must leave alone."""
    inputs = {"--model": ft.model} if Path(ft.model).exists() else {}
    files = sorted(glob.glob(ft.data))
    inputs.update({"--data" if len(files) == 1 else f"--data's {Path(f).name}": f for f in files})
    return inputs


def _plot_losses(history, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(e["step"], e["loss"]) for e in history if "loss" in e]
    evals = [(e["step"], e["eval_loss"]) for e in history if "eval_loss" in e]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="train loss")
    if evals:
        ax.plot(*zip(*evals), "o-", label="eval loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title("hf-zero finetune")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def with_lora(model, ft):
    """The model wrapped with a LoRA adapter; a classifier's new head trains whole (peft's modules_to_save)."""
    from peft import LoraConfig, TaskType, get_peft_model

    targets = ft.lora_target_modules
    config = LoraConfig(r=ft.lora_r, lora_alpha=ft.lora_alpha or 2 * ft.lora_r, lora_dropout=ft.lora_dropout,
                        target_modules=targets if targets == "all-linear" else [t.strip() for t in targets.split(",")],
                        task_type=TaskType.SEQ_CLS if ft.task == "classification" else TaskType.CAUSAL_LM)
    try:
        return get_peft_model(model, config)
    except ValueError as e:  # peft names the modules it could not find
        raise ValueError(f"--lora_target_modules {targets!r}: {e}") from None


def save_final(trainer, ft, final: Path) -> None:
    """OUTPUT_DIR/final: a full model folder that from_pretrained loads (for LoRA: the adapter merged in)."""
    if not ft.lora_r:
        trainer.save_model(str(final))
        return
    from ..distributed import barrier
    from ..checkpoints.adapters import merge_and_save, save_adapter
    from ..modeling import unwrap_model

    adapter = save_adapter(trainer, final.parent / "adapter")  # every rank: gathers only the adapter
    if trainer.is_world_process_zero():
        base = unwrap_model(trainer).get_base_model()
        config = copy.deepcopy(base.config)
        config.architectures = [type(base).__name__]  # the class with the head this run trained
        merge_and_save(adapter, ft.model, final, config=config)
    barrier()


def run(ft, args) -> dict:
    tokenizer = load_tokenizer(ft)
    task = build_task(ft, tokenizer)
    model = load_model(ft, task)  # after TrainingArguments: ZeRO-3 partitions it at load
    if ft.lora_r:
        model = with_lora(model, ft)
    trainer = Trainer(model=model, args=args, train_dataset=task.train, eval_dataset=task.eval,
                      data_collator=task.collator, compute_metrics=task.compute_metrics, processing_class=tokenizer)
    zero = attach(trainer, **({"long_context": True} if ft.long_context else {}))
    started = time.time()
    trainer.train()
    train_seconds = time.time() - started
    final = Path(args.output_dir) / "final"
    save_final(trainer, ft, final)
    history = trainer.state.log_history
    evals = [e for e in history if "eval_loss" in e]
    summary = {
        "model": ft.model, "data": ft.data, "task": ft.task, "finetune_args": ft.__dict__,
        "preset": ft.preset,
        "zero_stage": zero.stage, "world_size": args.world_size, "device": "cuda" if has_gpu() else "cpu",
        "train_rows": len(task.train), "eval_rows": len(task.eval), "steps": trainer.state.global_step,
        "train_seconds": round(train_seconds, 1), "before": summarise_metrics(evals[0]) if evals else {},
        "after_in_run": summarise_metrics(evals[-1]) if len(evals) > 1 else {}, "saved_model": str(final),
        "warnings": zero.warnings, "log_history": history,
    }
    if trainer.is_world_process_zero():
        (Path(args.output_dir) / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        _plot_losses(history, Path(args.output_dir) / "loss_curve.png")
    return summary


def _reload_check(output_dir) -> int:
    """Reload the saved model in a fresh process (no DeepSpeed config alive, no launcher env) and evaluate it."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID") and not k.startswith("ACCELERATE_")}
    if has_gpu():
        # one device, as a user loading the model would: with several visible GPUs the Trainer
        # would wrap it in DataParallel and scale the loss by the GPU count
        env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    return subprocess.run([sys.executable, "-m", "hf_zero.finetune.report", str(output_dir)], env=env).returncode


def main(argv=None) -> int:
    name_cpu_accelerator()  # before anything imports DeepSpeed: no "Setting accelerator to CPU" on every rank
    try:
        ft, args = parse(argv)
        run(ft, args)
    except (HfZeroError, ValueError, OSError) as e:
        if is_main_process():
            print(f"hf-zero finetune: error: {e}", file=sys.stderr)
        return 2
    finally:
        shutdown()
    if is_main_process() and ft.reload_check:
        return _reload_check(args.output_dir)
    return 0
