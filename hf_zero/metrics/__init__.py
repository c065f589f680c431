"""Metrics for `hf-zero finetune`, loadable without the Hugging Face Hub.

accuracy/ and f1/ are `evaluate` modules shipped inside the package (package data,
not subpackages), so `evaluate.load` reads them from disk.
"""

import math
from pathlib import Path

BUNDLED = Path(__file__).resolve().parent

__all__ = ["BUNDLED", "classification_metrics", "load_metric", "perplexity"]


def load_metric(name, **kwargs):
    """evaluate.load() the bundled module `name` if there is one, else whatever evaluate finds (Hub, cache)."""
    import evaluate  # imported here: it is an optional dependency and slow to import

    script = BUNDLED / name / f"{name}.py"
    return evaluate.load(str(script) if script.is_file() else name, **kwargs)


def classification_metrics(num_labels):
    """A Trainer `compute_metrics` giving accuracy and F1 (binary for two labels, else macro)."""
    import numpy as np

    # In memory: every rank of a distributed run calls compute_metrics, and evaluate's
    # on-disk cache files would have the same name on all of them.
    accuracy = load_metric("accuracy", keep_in_memory=True)
    f1 = load_metric("f1", keep_in_memory=True)
    average = "binary" if num_labels == 2 else "macro"

    def compute_metrics(eval_pred):
        logits = eval_pred.predictions
        if isinstance(logits, tuple):  # models that also return hidden states/attentions
            logits = logits[0]
        predictions = np.argmax(logits, axis=-1)
        references = eval_pred.label_ids
        return {
            **accuracy.compute(predictions=predictions, references=references),
            **f1.compute(predictions=predictions, references=references, average=average),
        }

    return compute_metrics


def perplexity(eval_loss):
    """exp(mean token cross-entropy); inf rather than OverflowError for a diverged model."""
    try:
        return math.exp(eval_loss)
    except OverflowError:
        return math.inf
