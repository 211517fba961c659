"""The Task protocol: what a site trains, and how a task is found by name.

A task bundles a model, the data it learns from, and how to train and evaluate it. Both
modes (federated and gossip) and every simulation use the same task object, so a user can
run one task both ways and compare.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from fedweave.errors import UserError


@dataclass(frozen=True)
class ArrayData:
    """Features and integer labels held in memory as NumPy arrays.

    ``x`` is float32 with shape ``(n, *input_shape)``; ``y`` is int64 with shape ``(n,)``.
    """

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, indices: np.ndarray) -> ArrayData:
        return ArrayData(self.x[indices], self.y[indices])


@runtime_checkable
class Task(Protocol):
    """What a site trains.

    Attributes:
        name: short identifier recorded in the history (``"digits"``).
        input_shape: shape of one example, without the batch dimension.
        num_classes: number of label classes; labels are ``0 .. num_classes-1``.
    """

    name: str
    input_shape: tuple[int, ...]
    num_classes: int

    def build_model(self) -> Any:
        """A fresh ``torch.nn.Module``; call ``torch.manual_seed`` first for a fixed init."""

    def load_data(self) -> tuple[ArrayData, ArrayData]:
        """The task's own (train pool, held-out test) data, used by simulations and splits."""

    def train(self, model: Any, data: ArrayData, config: Any) -> dict[str, float]:
        """Train ``model`` in place on ``data`` with a ``fedweave.learning.TrainConfig``."""

    def evaluate(self, model: Any, data: ArrayData, config: Any) -> dict[str, float]:
        """Return at least ``{"loss": ..., "accuracy": ...}`` of ``model`` on ``data``."""


BUILTIN_TASKS = {
    "digits": "fedweave.learning.tasks.digits:DigitsTask",
    "mnist5k": "fedweave.learning.tasks.mnist5k:Mnist5kTask",
}


def load_task(spec: str) -> Task:
    """Find a task by built-in name (``digits``) or as ``module:attr`` for a user task.

    ``attr`` may be a Task instance, a Task class, or a zero-argument factory.
    """
    if spec.startswith("synthetic-"):
        from fedweave.learning.tasks.synthetic import SyntheticTask

        return SyntheticTask.from_name(spec)
    target = BUILTIN_TASKS.get(spec, spec)
    if ":" not in target:
        known = ", ".join(sorted(BUILTIN_TASKS))
        raise UserError(
            f"unknown task '{spec}': use one of {known}, synthetic-A-B (e.g. synthetic-1-1), "
            "synthetic-iid, or 'my_module:my_task'"
        )
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(
            f"task '{spec}': cannot import module '{module_name}' ({exc}); "
            "check the name and that it is on PYTHONPATH"
        ) from exc
    try:
        obj = getattr(module, attr)
    except AttributeError as exc:
        raise UserError(f"task '{spec}': module '{module_name}' has no attribute '{attr}'") from exc
    not_a_task = UserError(
        f"task '{spec}' is not a Task: it needs name, input_shape, num_classes, "
        "build_model(), load_data(), train() and evaluate()"
    )
    if isinstance(obj, type) and not isinstance(obj, Task):
        raise not_a_task
    if isinstance(obj, type) or (callable(obj) and not isinstance(obj, Task)):
        try:
            obj = obj()
        except TypeError as exc:
            raise UserError(f"task '{spec}' cannot be created without arguments ({exc})") from exc
    if not isinstance(obj, Task):
        raise not_a_task
    return obj
