"""Shared base for built-in classification tasks: they train with fedweave's own loop."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedweave.learning.task import ArrayData
from fedweave.learning.training import TrainConfig, evaluate_model, objective_of, train_epochs

HELD_OUT_SEED = 20261121
"""The held-out test split never depends on the run seed, so runs compare on one test set."""


def held_out_split(
    x: np.ndarray, y: np.ndarray, test_fraction: float
) -> tuple[ArrayData, ArrayData]:
    """Stratified, fixed split of a labelled set into (train pool, held-out test)."""
    rng = np.random.default_rng(HELD_OUT_SEED)
    test_idx: list[np.ndarray] = []
    for label in np.unique(y):
        members = np.flatnonzero(y == label)
        rng.shuffle(members)
        test_idx.append(members[: int(round(len(members) * test_fraction))])
    test = np.sort(np.concatenate(test_idx))
    train = np.setdiff1d(np.arange(len(y)), test)
    data = ArrayData(x.astype(np.float32, copy=False), y.astype(np.int64, copy=False))
    return data.subset(train), data.subset(test)


class ClassificationTask:
    """Cross-entropy classification; subclasses set the shape, classes, model and data."""

    name: str = "classification"
    input_shape: tuple[int, ...] = ()
    num_classes: int = 0

    def build_model(self) -> Any:
        raise NotImplementedError

    def load_data(self) -> tuple[ArrayData, ArrayData]:
        raise NotImplementedError

    def train(self, model: Any, data: Any, config: TrainConfig) -> dict[str, float]:
        return train_epochs(model, data, config, objective_of(self))

    def evaluate(self, model: Any, data: Any, config: TrainConfig) -> dict[str, float]:
        return evaluate_model(model, data, config, objective=objective_of(self))
