"""Shared base for built-in classification tasks: they train with fedweave's own loop.

torch is imported when a model is built or trained, not with the task: the processes that
only check a site's data or a run's settings (``fedweave client``'s supervisor, the
``fedweave coordinator`` process) start without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fedweave.learning.task import ArrayData

if TYPE_CHECKING:
    from fedweave.learning.training import TrainConfig

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
    metrics: tuple[str, ...] = ("loss", "accuracy")
    """What ``evaluate`` returns: the multi-class objective's metrics (said here so that
    reading them needs no torch; tests/test_tasks.py holds the two equal)."""
    trains_across_processes: bool = True
    """``train`` is ``train_epochs``, which splits each batch over a site's processes
    (``--nproc-per-node``); a subclass with a loop of its own sets it False."""

    def build_model(self) -> Any:
        raise NotImplementedError

    def load_data(self) -> tuple[ArrayData, ArrayData]:
        raise NotImplementedError

    def train(self, model: Any, data: Any, config: TrainConfig) -> dict[str, float]:
        from fedweave.learning.training import objective_of, train_epochs

        return train_epochs(model, data, config, objective_of(self))

    def evaluate(self, model: Any, data: Any, config: TrainConfig) -> dict[str, float]:
        from fedweave.learning.training import evaluate_model, objective_of

        return evaluate_model(model, data, config, objective=objective_of(self))
