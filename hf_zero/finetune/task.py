"""Model, tokenizer, datasets, collator and metrics for one fine-tuning task; shared by the run and the reload check."""

from dataclasses import dataclass
from pathlib import Path

from . import data as task_data


@dataclass
class Task:
    train: object
    eval: object
    collator: object
    compute_metrics: object
    model_kwargs: dict


def _model_class(task):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    return AutoModelForSequenceClassification if task == "classification" else AutoModelForCausalLM


def check_model_source(ft) -> None:
    """A missing local model folder gets one line, not a Hub lookup traceback."""
    looks_local = ft.model.startswith((".", "/", "~")) or Path(ft.model).suffix or Path(ft.model).exists()
    if looks_local and not Path(ft.model).expanduser().exists():
        raise ValueError(f"--model {ft.model!r} does not exist; pass a folder with config.json or a Hub id")


def load_tokenizer(ft, source=None):
    from transformers import AutoTokenizer

    kwargs = {"gguf_file": ft.gguf_file} if ft.gguf_file and source is None else {}
    return AutoTokenizer.from_pretrained(source or ft.model, trust_remote_code=getattr(ft, "trust_remote_code", False), **kwargs)


def build_task(ft, tokenizer) -> Task:
    dsd = task_data.load_table(ft.data)
    model_kwargs = {}
    if ft.task == "classification":
        labels = [s.strip() for s in ft.labels.split(",")] if ft.labels else None
        dsd, names = task_data.prepare_classification(dsd, tokenizer, ft.text_column, ft.label_column, ft.max_length, labels)
        model_kwargs = task_data.label_config(names)
        from ..metrics import classification_metrics

        compute_metrics = classification_metrics(len(names))
    elif ft.task == "causal_lm":
        dsd = task_data.prepare_causal_lm(dsd, tokenizer, ft.text_column, ft.max_length)
        compute_metrics = None  # perplexity comes from eval_loss
    else:
        dsd = task_data.prepare_chat(dsd, tokenizer, ft.messages_column, ft.max_length)
        compute_metrics = None
    train, evaluation = dsd["train"], dsd["validation"]
    if ft.max_train_samples:
        train = train.select(range(min(ft.max_train_samples, len(train))))
    if ft.max_eval_samples:
        evaluation = evaluation.select(range(min(ft.max_eval_samples, len(evaluation))))
    from ..distributed import has_gpu
    from ..batch_padding import GPU_PAD_MULTIPLE

    pad_multiple = GPU_PAD_MULTIPLE if has_gpu() else None  # on CPU alignment buys nothing
    collator = task_data.data_collator(ft.task, tokenizer, pad_multiple)
    return Task(train, evaluation, collator, compute_metrics, model_kwargs)


def load_model(ft, task: Task, source=None, **kwargs):
    """from_pretrained; under a live ZeRO-3 TrainingArguments this is partitioned by zero.Init."""
    model_class = _model_class(ft.task)
    if source is None and ft.gguf_file:
        kwargs["gguf_file"] = ft.gguf_file
    if ft.task == "classification" and source is None:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(ft.model, trust_remote_code=getattr(ft, "trust_remote_code", False))
        # A checkpoint that already has a classifier head must match the data's labels; a base model gets a new head.
        if any("ForSequenceClassification" in a for a in (config.architectures or [])):
            task_data.check_num_labels(config, list(task.model_kwargs["id2label"].values()))
    model = model_class.from_pretrained(source or ft.model, **(task.model_kwargs if source is None else {}),
                                        trust_remote_code=getattr(ft, "trust_remote_code", False), **kwargs)
    if getattr(model, "hf_quantizer", None) is not None and ft.gguf_file:
        # GGUF weights are de-quantised to float on load; what we save is a plain model
        model.hf_quantizer = None
        model.config.quantization_config = None
    return model


def summarise_metrics(metrics: dict) -> dict:
    """eval_* metrics without the prefix, plus perplexity for language models."""
    from ..metrics import perplexity

    out = {k.removeprefix("eval_"): v for k, v in metrics.items()
           if k.startswith("eval_") and not k.endswith(("runtime", "per_second")) and k != "eval_epoch"}
    if "loss" in out and "accuracy" not in out:
        out["perplexity"] = perplexity(out["loss"])
    return out
