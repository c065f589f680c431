"""Accuracy as an `evaluate` module, bundled so `evaluate.load` needs no Hub download.

Load it with evaluate.load("<path to this folder or file>") or hf_zero.metrics.load_metric("accuracy").
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Accuracy: the fraction of predictions that equal their reference."

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted class ids.
    references (list of int): true class ids.
Returns:
    accuracy (float): between 0 and 1.
Examples:
    >>> accuracy.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0])
    {'accuracy': 0.75}
"""


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}),
        )

    def _compute(self, predictions, references):
        return {"accuracy": float(np.mean(np.asarray(predictions) == np.asarray(references)))}
