"""A model's predictions for new data, one row per example, by the task's objective.

- multi-class: the predicted class and each class's probability (softmax);
- binary: the predicted class and the positive class's probability (sigmoid);
- regression: the predicted value;
- multi-label: each label's probability and 0/1 decision.

Class values are the task's own spelling when it names them (a tabular label's classes),
else their indices.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch

from fedweave.learning.decoding import decoded, prediction_rows
from fedweave.learning.objectives import Binary, MultiLabel, Regression
from fedweave.learning.training import (
    TrainConfig,
    _autocast,
    for_data,
    iterate_batches,
    objective_of,
    pick_device,
    use_amp,
)


def model_outputs(model: torch.nn.Module, data: Any, config: TrainConfig) -> np.ndarray:
    """The model's raw outputs (float32) for every example of ``data``, in order."""
    device = pick_device(config.device)
    model.to(device)
    model.eval()
    parts = []
    batches = iterate_batches(data, 512, device, False, num_workers=config.num_workers)
    with torch.no_grad():
        for xb, _ in batches:
            with _autocast(device) if use_amp(config, device) else contextlib.nullcontext():
                outputs = model(xb)
            parts.append(outputs.float().cpu().numpy())
    return np.concatenate(parts) if parts else np.zeros((0,), dtype=np.float32)


def output_kind(objective: Any) -> str:
    """The ``decoding`` kind of ``objective``'s outputs."""
    if isinstance(objective, Regression):
        return "regression"
    if isinstance(objective, Binary):
        return "binary"
    if isinstance(objective, MultiLabel):
        return "multilabel"
    return "multiclass"


def prediction_columns(
    task: Any, outputs: np.ndarray, data: Any = None
) -> tuple[list[str], list[list[Any]]]:
    """(header, rows) of the predictions for ``outputs`` under the task's objective, as it
    applies to ``data`` (a regression's label standardisation)."""
    objective = for_data(objective_of(task), data)
    names = tuple(task.label_names()) if hasattr(task, "label_names") else ()
    kind = output_kind(objective)
    scale = (objective.label_mean, objective.label_std) if kind == "regression" else (0.0, 1.0)
    return prediction_rows(decoded(outputs, kind, *scale), kind, names)
