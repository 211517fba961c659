"""A model's raw outputs as predictions, by the kind of its objective: the one formula
``fedweave predict`` (``prediction.py``) and an exported model (``exported_model.py``) share.

- ``multiclass``: each class's probability (softmax);
- ``binary``: the positive class's probability (sigmoid);
- ``regression``: the value in the label's units (``output * label_std + label_mean``);
- ``multilabel``: each label's probability (sigmoid).

Plain numpy, no training code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

OUTPUT_KINDS = ("multiclass", "binary", "regression", "multilabel")


def decoded(outputs: np.ndarray, kind: str, label_mean: float = 0.0, label_std: float = 1.0):
    """The predictions for raw ``outputs`` (``(n, k)``) of a model whose objective is
    ``kind``: probabilities ``(n,)`` or ``(n, k)``, or values ``(n,)`` (float64)."""
    if kind == "regression":
        return outputs.reshape(len(outputs), -1)[:, 0].astype(np.float64) * label_std + label_mean
    if kind == "binary":
        return 1.0 / (1.0 + np.exp(-outputs.reshape(len(outputs), -1)[:, 0]))
    if kind == "multilabel":
        return 1.0 / (1.0 + np.exp(-outputs))
    if kind == "multiclass":
        shifted = outputs - outputs.max(axis=1, keepdims=True)
        return np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    raise ValueError(f"unknown output kind {kind!r}; one of {OUTPUT_KINDS}")


def prediction_rows(
    predictions: np.ndarray, kind: str, classes: tuple[Any, ...] = ()
) -> tuple[list[str], list[list[Any]]]:
    """(header, rows) of ``predictions`` (``decoded``) as ``fedweave predict`` writes them:
    the predicted value or class (spelled as ``classes`` names it, else its index), then the
    probabilities."""

    def spelled(index: int) -> Any:
        return classes[index] if index < len(classes) else index

    if kind == "regression":
        return ["prediction"], [[float(v)] for v in predictions]
    if kind == "binary":
        return ["prediction", "probability"], [
            [spelled(int(p > 0.5)), float(p)] for p in predictions
        ]
    if kind == "multilabel":
        labels = range(predictions.shape[1])
        header = [f"label_{i}" for i in labels] + [f"probability_{i}" for i in labels]
        return header, [
            [int(p > 0.5) for p in row] + [float(p) for p in row] for row in predictions
        ]
    header = ["prediction"] + [f"probability_{spelled(i)}" for i in range(predictions.shape[1])]
    return header, [[spelled(int(row.argmax()))] + [float(p) for p in row] for row in predictions]
