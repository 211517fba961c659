"""What a model's outputs are scored against: a loss for training and the metrics that suit it.

Four label kinds are ready as building blocks a task composes (``task.objective``):
multi-class (softmax + cross-entropy), binary (one logit, sigmoid + BCE), regression (MSE or
MAE) and multi-label (one logit per label, BCE). A task with another loss implements the same
two methods (``loss`` and ``scorer``), or writes its own ``train``/``evaluate``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn


class Scorer(Protocol):
    """Accumulates one pass over the data, batch by batch, into metrics."""

    def add(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        """One batch's model outputs (detached, float32) and targets."""

    def result(self) -> dict[str, float]:
        """The pass's metrics, ``loss`` included (mean per example)."""


@runtime_checkable
class Objective(Protocol):
    """A loss and its metrics.

    Attributes:
        name: short identifier shown in the run header (``"binary"``).
        target_dtype: dtype labels are read as (``torch.int64`` for class indices,
            ``torch.float32`` otherwise).
        headline: the metric a progress line shows next to the loss (``"accuracy"``).

    Optional: ``metrics``, every metric an evaluation pass returns (``loss`` included); a
    run's ``--select-metric`` is checked against them before round 1 (without it, at the
    first evaluated round).
    """

    name: str
    target_dtype: torch.dtype
    headline: str

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss of one batch (a differentiable scalar)."""

    def scorer(self, full: bool = True) -> Scorer:
        """A fresh accumulator for one pass; ``full=False`` (training) may skip metrics
        that cost more than the step (the binary AUC keeps every score)."""


class _Sums:
    """Example-weighted sums of per-batch values, kept on the device until the end."""

    def __init__(self) -> None:
        self.count = 0
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, name: str, batch_sum: torch.Tensor) -> None:
        total = self.sums.get(name)
        if total is None:
            self.sums[name] = batch_sum.detach().double()
        else:
            total.add_(batch_sum.detach())  # in place: no new tensor a batch

    def means(self) -> dict[str, float]:
        if self.count == 0:
            return {name: float("nan") for name in self.sums}
        return {name: float(total.item()) / self.count for name, total in self.sums.items()}


@dataclass(frozen=True)
class MultiClass:
    """One label out of ``num_classes``: logits ``(n, C)``, class indices ``(n,)``."""

    name: str = "multiclass"
    target_dtype: torch.dtype = torch.int64
    headline: str = "accuracy"
    metrics: tuple[str, ...] = ("loss", "accuracy")

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(outputs, targets)

    def scorer(self, full: bool = True) -> Scorer:
        return _MultiClassScorer(with_loss=full)


class _MultiClassScorer(_Sums):
    def __init__(self, with_loss: bool) -> None:
        super().__init__()
        self.with_loss = with_loss  # training keeps its own loss sum

    def add(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:  # type: ignore[override]
        self.count += int(targets.shape[0])
        if self.with_loss:
            super().add("loss", nn.functional.cross_entropy(outputs, targets, reduction="sum"))
        super().add("accuracy", (outputs.argmax(dim=1) == targets).sum())

    def result(self) -> dict[str, float]:
        return self.means()


@dataclass(frozen=True)
class Binary:
    """Yes/no labels: one logit per example (``(n,)`` or ``(n, 1)``), targets 0/1.

    Metrics: loss (BCE), accuracy at probability 0.5, and the ROC AUC (rank-based, exact,
    from every score of the pass: 4 bytes an example).
    """

    name: str = "binary"
    target_dtype: torch.dtype = torch.float32
    headline: str = "accuracy"
    metrics: tuple[str, ...] = ("loss", "accuracy", "auc")

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(outputs.reshape(-1), targets)

    def scorer(self, full: bool = True) -> Scorer:
        return _BinaryScorer(keep_scores=full)


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with tied ranks averaged); NaN with one class."""
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    from scipy.stats import rankdata

    ranks = rankdata(scores)
    u = ranks[labels == 1].sum() - positives * (positives + 1) / 2
    return float(u / (positives * negatives))


class _BinaryScorer(_Sums):
    def __init__(self, keep_scores: bool) -> None:
        super().__init__()
        self.keep_scores = keep_scores
        self.scores: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []

    def add(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:  # type: ignore[override]
        logits = outputs.reshape(-1)
        self.count += int(targets.shape[0])
        super().add(
            "loss", nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="sum")
        )
        super().add("accuracy", ((logits > 0).float() == targets).sum())
        if self.keep_scores:
            self.scores.append(logits.float().cpu().numpy())
            self.labels.append(targets.cpu().numpy())

    def result(self) -> dict[str, float]:
        metrics = self.means()
        if self.scores:
            metrics["auc"] = roc_auc(np.concatenate(self.scores), np.concatenate(self.labels))
        return metrics


@dataclass(frozen=True)
class Regression:
    """Real-valued targets ``(n,)`` or ``(n, k)``; trained with ``loss`` ``"mse"`` (default)
    or ``"mae"``. Metrics: loss, mae, rmse.

    ``label_mean`` and ``label_std`` (default 0 and 1: as it is): the model learns the
    label standardised, ``(y - label_mean) / label_std`` (a label in the hundreds trains
    as slowly as unscaled features do), and its outputs mean ``output * label_std +
    label_mean``. The loss is the standardised one (what training minimises); MAE and RMSE
    are in the label's own units. ``scaled`` gives the objective for a site's data's
    ``label_scale``.
    """

    loss_kind: str = "mse"
    name: str = "regression"
    target_dtype: torch.dtype = torch.float32
    headline: str = "mae"
    metrics: tuple[str, ...] = ("loss", "mae", "rmse")
    label_mean: float = 0.0
    label_std: float = 1.0

    def __post_init__(self) -> None:
        if self.loss_kind not in ("mse", "mae"):
            raise ValueError(f"Regression loss must be 'mse' or 'mae', got {self.loss_kind!r}")
        if not self.label_std > 0:
            raise ValueError(f"Regression label_std must be > 0, got {self.label_std!r}")

    def scaled(self, mean: float, std: float) -> Regression:
        """This objective for a label standardised with ``mean`` and ``std``."""
        return replace(self, label_mean=float(mean), label_std=float(std))

    def values(self, outputs: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        """The model's ``outputs`` in the label's units."""
        return outputs * self.label_std + self.label_mean

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        outputs = outputs.reshape(targets.shape)
        targets = (targets - self.label_mean) / self.label_std
        if self.loss_kind == "mae":
            return nn.functional.l1_loss(outputs, targets)
        return nn.functional.mse_loss(outputs, targets)

    def scorer(self, full: bool = True) -> Scorer:
        return _RegressionScorer(self.loss_kind, self.label_mean, self.label_std)


class _RegressionScorer(_Sums):
    def __init__(self, loss_kind: str, label_mean: float = 0.0, label_std: float = 1.0) -> None:
        super().__init__()
        self.loss_kind = loss_kind
        self.label_mean = label_mean
        self.label_std = label_std

    def add(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:  # type: ignore[override]
        outputs = outputs.reshape(targets.shape)
        error = (outputs * self.label_std + self.label_mean - targets).reshape(
            targets.shape[0], -1
        )
        self.count += int(targets.shape[0])
        squared = (error**2).mean(dim=1).sum()
        absolute = error.abs().mean(dim=1).sum()
        loss = absolute / self.label_std if self.loss_kind == "mae" else squared / self.label_std**2
        super().add("loss", loss)
        super().add("mae", absolute)
        super().add("mse", squared)

    def result(self) -> dict[str, float]:
        metrics = self.means()
        metrics["rmse"] = float(np.sqrt(metrics.pop("mse")))
        return metrics


@dataclass(frozen=True)
class MultiLabel:
    """Any number of ``num_labels`` labels per example: logits and 0/1 targets ``(n, L)``.

    Metrics: loss (mean BCE over labels), accuracy (share of label decisions right) and
    micro-averaged F1.
    """

    name: str = "multilabel"
    target_dtype: torch.dtype = torch.float32
    headline: str = "f1"
    metrics: tuple[str, ...] = ("loss", "accuracy", "f1")

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(outputs, targets)

    def scorer(self, full: bool = True) -> Scorer:
        return _MultiLabelScorer()


class _MultiLabelScorer(_Sums):
    def add(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:  # type: ignore[override]
        self.count += int(targets.shape[0])
        per_example = nn.functional.binary_cross_entropy_with_logits(
            outputs, targets, reduction="none"
        ).mean(dim=1)
        predicted = (outputs > 0).float()
        super().add("loss", per_example.sum())
        super().add("accuracy", (predicted == targets).float().mean(dim=1).sum())
        super().add("_tp", (predicted * targets).sum())
        super().add("_fp", (predicted * (1 - targets)).sum())
        super().add("_fn", ((1 - predicted) * targets).sum())

    def result(self) -> dict[str, float]:
        metrics = self.means()
        tp, fp, fn = (metrics.pop(key) * self.count for key in ("_tp", "_fp", "_fn"))
        metrics["f1"] = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn > 0 else float("nan")
        return metrics
