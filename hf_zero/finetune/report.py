"""Reload a finished fine-tune with from_pretrained in a fresh process, evaluate it, print the before/after table.

    python -m hf_zero.finetune.report OUTPUT_DIR
"""

import json
import sys
from pathlib import Path
from types import SimpleNamespace


def evaluate_saved(summary: dict) -> dict:
    """Evaluate OUTPUT_DIR/final as a user would load it: plain from_pretrained, no DeepSpeed."""
    import torch
    from transformers import Trainer, TrainingArguments

    from .task import build_task, load_model, load_tokenizer, summarise_metrics

    ft = SimpleNamespace(**summary["finetune_args"])
    saved = summary["saved_model"]
    tokenizer = load_tokenizer(ft, source=saved)  # the tokenizer must have been saved with the model
    task = build_task(ft, tokenizer)
    model = load_model(ft, task, source=saved, dtype="auto")
    args = TrainingArguments(output_dir=str(Path(saved).parent / "reload_eval"), report_to="none",
                             use_cpu=not torch.cuda.is_available(), per_device_eval_batch_size=64,
                             bf16=next(model.parameters()).dtype == torch.bfloat16)
    trainer = Trainer(model=model, args=args, eval_dataset=task.eval, data_collator=task.collator,
                      compute_metrics=task.compute_metrics, processing_class=tokenizer)
    return summarise_metrics(trainer.evaluate())


def _fmt(value):
    return f"{value:.4f}" if isinstance(value, float) else ("-" if value is None else str(value))


def table(summary: dict) -> str:
    before, in_run, reloaded = summary["before"], summary["after_in_run"], summary.get("after_reloaded", {})
    keys = [k for k in ("loss", "accuracy", "f1", "perplexity") if k in before or k in reloaded]
    rows = [f"{'metric':<12}{'before':>12}{'after (run)':>14}{'after (reloaded)':>19}"]
    rows += [f"{k:<12}{_fmt(before.get(k)):>12}{_fmt(in_run.get(k)):>14}{_fmt(reloaded.get(k)):>19}" for k in keys]
    return "\n".join(rows)


def render(summary: dict, output_dir: Path) -> str:
    path = Path(summary["model"])
    name = path.parent.name if path.name == "model" else path.name  # packaged models live in .../<package>/model
    lines = [
        "",
        "=" * 64,
        f"hf-zero finetune: {name} ({summary['task']}) on {Path(summary['data']).name}",
        f"  ZeRO-{summary['zero_stage']} ({summary['preset'] or 'custom config'}), {summary['world_size']} "
        f"{summary['device'].upper()} process(es); {summary['train_rows']} train / {summary['eval_rows']} eval rows; "
        f"{summary['steps']} steps in {summary['train_seconds']:.0f} s",
        "",
        table(summary),
        "",
        f"  saved model : {summary['saved_model']}  (reloaded with from_pretrained in a fresh process)",
        f"  loss curve  : {output_dir / 'loss_curve.png'}",
        f"  summary     : {output_dir / 'summary.json'}",
    ]
    for warning in summary.get("warnings", []):
        lines.append(f"  warning     : {warning}")
    lines.append("=" * 64)
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from ..distributed import name_cpu_accelerator

    name_cpu_accelerator()
    if len(argv) != 1:
        print("usage: python -m hf_zero.finetune.report OUTPUT_DIR", file=sys.stderr)
        return 2
    output_dir = Path(argv[0])
    summary_file = output_dir / "summary.json"
    if not summary_file.exists():
        print(f"hf_zero report: error: {summary_file} does not exist; run hf-zero finetune first", file=sys.stderr)
        return 2
    summary = json.loads(summary_file.read_text())
    summary["after_reloaded"] = evaluate_saved(summary)
    summary_file.write_text(json.dumps(summary, indent=1, default=str))
    print(render(summary, output_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
