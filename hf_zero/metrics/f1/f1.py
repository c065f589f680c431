"""F1 score (binary or macro) as an `evaluate` module, bundled so `evaluate.load` needs no Hub download.

Computed with numpy rather than scikit-learn so the finetune extra stays light;
the results match sklearn.metrics.f1_score with zero_division=0.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "F1: the harmonic mean of precision and recall, 2 * tp / (2 * tp + fp + fn)."

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted class ids.
    references (list of int): true class ids.
    average (str): "binary" (default) scores the `pos_label` class only;
        "macro" averages the per-class scores over every class seen (or `labels`).
    pos_label (int): the positive class for average="binary". Defaults to 1.
    labels (list of int): the classes to average over for average="macro".
Returns:
    f1 (float): between 0 and 1; a class never predicted nor present scores 0.
Examples:
    >>> f1.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0])
    {'f1': 0.6666666666666666}
    >>> f1.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0], average="macro")
    {'f1': 0.7333333333333334}
"""


class F1(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}),
        )

    def _compute(self, predictions, references, average="binary", pos_label=1, labels=None):
        predictions, references = np.asarray(predictions), np.asarray(references)
        seen = np.union1d(predictions, references)
        if average == "binary":
            if len(seen) > 2:
                raise ValueError(f"average='binary' needs two classes, got {len(seen)}; use average='macro'")
            classes = [pos_label]
        elif average == "macro":
            classes = seen if labels is None else labels
        else:
            raise ValueError(f"average={average!r} is not supported; use 'binary' or 'macro'")
        scores = []
        for c in classes:
            tp = np.sum((predictions == c) & (references == c))
            wrong = np.sum((predictions == c) != (references == c))  # fp + fn
            scores.append(2 * tp / (2 * tp + wrong) if tp + wrong else 0.0)
        return {"f1": float(np.mean(scores))}
