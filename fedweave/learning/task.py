"""The Task protocol: what a site trains (how a task is found by name: ``load_task`` in
``fedweave.learning.tasks``, beside the built-in tasks it names).

A task bundles a model, the data it learns from, and how to train and evaluate it. Both
modes (federated and gossip) and every simulation use the same task object, so a user can
run one task both ways and compare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from fedweave.errors import UserError


@dataclass(frozen=True)
class ArrayData:
    """Features and integer labels held in memory as NumPy arrays.

    ``x`` is float32 with shape ``(n, *input_shape)``; ``y`` is int64 with shape ``(n,)``
    (float32 for a regression). ``label_scale``: a regression label's ``(mean, std)`` that
    the model learns it standardised with (``Regression.scaled``; ``None``: as it is).
    """

    x: np.ndarray
    y: np.ndarray
    label_scale: tuple[float, float] | None = None

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, indices: np.ndarray) -> ArrayData:
        return ArrayData(self.x[indices], self.y[indices], self.label_scale)


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
    ``fedweave/learning/statistics.py`` describes. ``local_layers``: names of modules of the
    model (``named_modules()``) whose tensors stay at each site, a personal head
    (``fedweave/learning/personal.py``). ``trains_across_processes``: True when ``train``
    hands its ``TrainConfig`` to ``fedweave.learning.train_epochs`` (as the built-in tasks
    do), which splits each batch over a site's processes (``--nproc-per-node``); a task
    without it trains in one process. ``shards_model``: True to have those processes shard
    the model's parameters among them (FSDP) rather than each hold it whole, for a model
    larger than one GPU.

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
