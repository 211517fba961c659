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


class NoTaskData(UserError):
    """The task has no data of its own: a real task's data lives at the sites (raised by
    ``load_data``; a coordinator then scores rounds by federated evaluation only)."""


@dataclass(frozen=True)
class TrainingDefaults:
    """How a task trains unless the run says otherwise (flags and config files override).

    Attributes:
        optimizer: ``"sgd"`` (with ``momentum``) or ``"adamw"`` (default ``"sgd"``).
        lr: learning rate (default 0.1, SGD's; AdamW wants ~1e-3).
        momentum: SGD momentum (default 0.9; unused by AdamW).
        weight_decay: decoupled for AdamW, L2 for SGD (default 0).
        batch_size: examples per step (default 16).
        local_epochs: local epochs per round (default 1).
        clip_grad_norm: bound on the gradient's L2 norm each step (default ``None``: none).
    """

    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    batch_size: int = 16
    local_epochs: int = 1
    clip_grad_norm: float | None = None


def training_defaults(task: object) -> TrainingDefaults:
    """The task's declared ``training_defaults``, or the generic ones."""
    declared = getattr(task, "training_defaults", None)
    return declared if isinstance(declared, TrainingDefaults) else TrainingDefaults()


@runtime_checkable
class Task(Protocol):
    """What a site trains.

    Optional, beyond the protocol: ``objective`` (``fedweave.learning.objectives``: the loss
    and metrics the built-in loop uses; multi-class when absent), ``training_defaults``
    (``TrainingDefaults``), and ``read_site_data(path)``, which turns a site's ``--data``
    (a file or a folder) into a ``torch.utils.data.Dataset`` of ``(x, y)`` tensor pairs, so
    a site's data is streamed rather than held in memory. Without it, sites read ``.npz``
    and ``.csv`` files into ``ArrayData``. A task that generates each simulated site's own
    data (the synthetic tasks) defines ``site_data(index, seed) -> (train, test)``; a
    simulation then writes site ``index``'s file from it instead of splitting
    ``load_data()``. Tasks that need federated statistics before round 1 declare them as
    ``fedweave/learning/statistics.py`` describes.

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

    def train(self, model: Any, data: Any, config: Any) -> dict[str, float]:
        """Train ``model`` in place on ``data`` (``ArrayData`` or a ``Dataset``) with a
        ``fedweave.learning.TrainConfig``."""

    def evaluate(self, model: Any, data: Any, config: Any) -> dict[str, float]:
        """Return at least ``{"loss": ...}`` of ``model`` on ``data`` (and ``accuracy`` for
        classification), plus any metric the task computes."""


BUILTIN_TASKS = {
    "digits": "fedweave.learning.tasks.digits:DigitsTask",
    "mnist5k": "fedweave.learning.tasks.mnist5k:Mnist5kTask",
    "digit-folders": "fedweave.learning.tasks.digit_folders:DigitFoldersTask",
    "breast-cancer": "fedweave.learning.tasks.breast_cancer:task",
    "breast-cancer-raw": "fedweave.learning.tasks.breast_cancer:raw_task",
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
