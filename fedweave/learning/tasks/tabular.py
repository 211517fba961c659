"""``TabularTask``: a table's declared columns into a small MLP, standardised together.

A user task is a few lines::

    from fedweave import Categorical, Label, Numeric, TabularTask

    task = TabularTask(
        name="heart",
        features=[Numeric("age"), Numeric("chol", impute=True), Categorical("sex", ("F", "M"))],
        label=Label("disease", kind="binary", classes=("no", "yes")),
    )

Sites then read their own ``.csv``/``.parquet`` by column name (``read_site_data``); the
platform gathers the feature statistics before round 1 (``fedweave/learning/statistics.py``)
and every site standardises with them (``prepare``). ``standardise=False`` switches that off.

Under differential privacy no statistics are gathered (DP does not cover them): every numeric
column must declare public ``bounds``, and the features are scaled to [-1, 1] with them
(``declared_statistics``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from fedweave.learning.objectives import Binary, MultiClass, Objective, Regression
from fedweave.learning.tables import (
    TABULAR_DEFAULTS,
    Categorical,
    Label,
    Numeric,
    Table,
    TabularSchema,
    clipped_to_bounds,
    encode,
    read_table,
)
from fedweave.learning.task import ArrayData, NoTaskData, TrainingDefaults
from fedweave.learning.training import TrainConfig, evaluate_model, train_epochs

SCALE_SHRINK = 64.0
"""``log2`` magnitudes travel divided by this, so they stay inside SecAgg+'s default range."""
MIN_STD = 1e-6


class TabularTask:
    """A classification or regression task over declared table columns.

    Args:
        name: the task's name, recorded in the history.
        features: the feature columns (``Numeric`` / ``Categorical``), in model-input order.
        label: the label column (``Label``).
        hidden: widths of the MLP's hidden layers (default ``(32, 16)``).
        standardise: scale numeric features with the federated means and standard deviations
            (default ``True``); ``False`` feeds them as read (for comparison).
        training_defaults: how sites train unless the run says otherwise (default AdamW,
            lr 0.003, batch 32).
    """

    trains_across_processes = True
    """``train`` is ``train_epochs``: a site may split it over processes (``--nproc-per-node``)."""

    def __init__(
        self,
        name: str,
        features: list[Numeric | Categorical] | tuple[Numeric | Categorical, ...],
        label: Label,
        hidden: tuple[int, ...] = (32, 16),
        standardise: bool = True,
        training_defaults: TrainingDefaults = TABULAR_DEFAULTS,
    ) -> None:
        self.name = name
        self.schema = TabularSchema(tuple(features), label)
        self.hidden = hidden
        self.standardise = standardise
        self.training_defaults = training_defaults
        self.input_shape = (self.schema.width,)
        self.num_classes = len(label.classes) if label.kind != "regression" else 0
        self.objective: Objective = {
            "binary": Binary(), "multiclass": MultiClass(), "regression": Regression(),
        }[label.kind]  # fmt: skip
        self.statistics_stages = ("scale", "moments")

    def build_model(self) -> nn.Module:
        outputs = self.num_classes if self.schema.label.kind == "multiclass" else 1
        layers: list[nn.Module] = []
        width = self.schema.width
        for size in self.hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, outputs))
        return nn.Sequential(*layers)

    def load_data(self) -> tuple[ArrayData, ArrayData]:
        raise NoTaskData(
            f"task '{self.name}' has no built-in data: give each site its table (--data, or "
            "--data-dir in a simulation); the coordinator scores rounds by federated "
            "evaluation, or centrally on a labelled --test-data table"
        )

    def read_site_data(self, path: Path, columns: dict[str, str] | None = None) -> Table:
        """A site's table; ``columns``: its column map (its headers → the task's columns,
        ``fedweave/learning/column_map.py``)."""
        return read_table(path, self.schema, columns=columns)

    def read_new_data(self, path: Path, columns: dict[str, str] | None = None) -> Table:
        """A table to score (``fedweave predict``): the label column may be absent;
        ``columns`` as ``read_site_data``'s."""
        return read_table(path, self.schema, labelled=False, columns=columns)

    def label_names(self) -> tuple[str, ...]:
        """The class values as the files spell them, by class index (none: regression)."""
        return self.schema.label.classes

    # Federated statistics (fedweave/learning/statistics.py)

    @property
    def _regression(self) -> bool:
        return self.schema.label.kind == "regression"

    def statistics_size(self, stage: str, known: dict[str, Any]) -> int:
        k, label = len(self.schema.numeric), int(self._regression)
        return k + label if stage == "scale" else 3 * k + max(self.num_classes, 0) + 2 * label

    def local_statistics(self, data: Table, stage: str, known: dict[str, Any]) -> np.ndarray:
        # A regression label rides with the features: its log2 magnitude in "scale", its
        # first two moments in "moments" (always present: a missing label is refused).
        values = data.numeric
        present = ~np.isnan(values)
        n = max(len(data), 1)
        labels = np.asarray(data.labels, dtype=np.float64) if self._regression else None
        if stage == "scale":
            if labels is not None:
                values = np.concatenate([values, labels[:, None]], axis=1)
                present = ~np.isnan(values)
            logs = np.where(present, np.log2(np.abs(np.nan_to_num(values)) + 1e-12), 0.0)
            logs = np.clip(logs, -SCALE_SHRINK, SCALE_SHRINK)
            counts = np.maximum(present.sum(axis=0), 1)
            return logs.sum(axis=0) / counts / SCALE_SHRINK
        scales = np.asarray(known["scales"], dtype=np.float64)
        scaled = np.where(present, np.nan_to_num(values) / scales, 0.0)
        parts = [present.sum(axis=0) / n, scaled.sum(axis=0) / n, (scaled**2).sum(axis=0) / n]
        if self.num_classes:
            parts.append(np.bincount(data.labels, minlength=self.num_classes) / n)
        if labels is not None:
            label = labels / float(known["label_power"])
            parts.append(np.array([label.sum() / n, (label**2).sum() / n]))
        return np.concatenate(parts)

    def add_statistics(self, stage: str, mean: np.ndarray, known: dict[str, Any]) -> dict[str, Any]:
        k = len(self.schema.numeric)
        if stage == "scale":
            # every site's vector is within [-1, 1] by construction; a pooled one outside
            # came from a rewritten reply, and 2 ** (its value * 64) would overflow
            powers = [2.0 ** round(v * SCALE_SHRINK) for v in np.clip(mean, -1.0, 1.0)]
            label = {"label_power": powers[k]} if self._regression else {}
            return {"scales": powers[:k], **label}
        scales = np.asarray(known["scales"], dtype=np.float64)
        share, first, second = mean[:k], mean[k : 2 * k], mean[2 * k : 3 * k]
        share = np.maximum(share, 1e-12)
        mu = first / share
        variance = np.maximum(second / share - mu**2, 0.0)
        std = np.sqrt(variance) * scales
        added: dict[str, Any] = {
            "means": (mu * scales).tolist(),
            "stds": np.where(std > MIN_STD, std, 1.0).tolist(),
            "schema": self.schema.digest(),
        }
        if self.num_classes:
            added["label_frequencies"] = mean[3 * k : 3 * k + self.num_classes].tolist()
        if self._regression:
            power = float(known["label_power"])
            first, second = float(mean[-2]), float(mean[-1])
            label_std = float(np.sqrt(max(second - first**2, 0.0))) * power
            added["label_mean"] = first * power
            added["label_std"] = label_std if label_std > MIN_STD else 1.0
        return added

    def undeclared_bounds(self) -> list[str]:
        """The numeric columns that declare no ``bounds``."""
        return [column.name for column in self.schema.numeric if column.bounds is None]

    def declared_statistics(self) -> dict[str, Any] | None:
        """Statistics from the columns' declared bounds alone, nothing read from any site's
        data (what a DP run scales with): each column's midpoint as its mean, its half-width
        as its standard deviation, so values within the bounds map to [-1, 1]; a missing
        value becomes the midpoint. ``None`` when a numeric column declares no bounds."""
        if self.undeclared_bounds():
            return None
        bounds = [column.bounds for column in self.schema.numeric]
        declared: dict[str, Any] = {
            "means": [(low + high) / 2 for low, high in bounds],
            "stds": [(high - low) / 2 for low, high in bounds],
            "schema": self.schema.digest(),
            "source": "declared bounds",
        }
        if self.schema.label.bounds is not None:
            low, high = self.schema.label.bounds
            declared.update(label_mean=(low + high) / 2, label_std=(high - low) / 2)
        return declared

    def prepare(self, data: Table, statistics: dict[str, Any]) -> ArrayData:
        k = len(self.schema.numeric)
        data = Table(
            clipped_to_bounds(data.numeric, self.schema.numeric), data.categorical,
            data.labels, data.source,
        )  # fmt: skip
        means = np.asarray(statistics.get("means", [0.0] * k), dtype=np.float64)
        stds = np.asarray(statistics.get("stds", [1.0] * k), dtype=np.float64)
        if not self.standardise:
            # Missing values still become the federated mean.
            return (
                encode(data, self.schema, np.zeros(k), np.ones(k))
                if not np.isnan(data.numeric).any()
                else _impute_only(data, self.schema, means)
            )
        encoded = encode(data, self.schema, means, stds)
        if self._regression and "label_mean" in statistics:
            # the objective standardises the label (Regression.scaled), so every metric
            # and prediction stays in the label's own units
            scale = (float(statistics["label_mean"]), float(statistics["label_std"]))
            return ArrayData(encoded.x, encoded.y, scale)
        return encoded

    def preparation(self, statistics: dict[str, Any] | None) -> dict[str, Any]:
        """How ``prepare`` turns raw columns into the model's inputs and its outputs back
        into predictions under ``statistics``, as plain JSON (what an exported model carries,
        ``fedweave/learning/exported_model.py``). A numeric value is clipped to ``clip``
        (its bounds), a missing one becomes ``fill``, then it is ``(value - center) / scale``
        (float64, then float32); a categorical one is one-hot over ``categories``."""
        k = len(self.schema.numeric)
        statistics = statistics or {}
        means = [float(v) for v in statistics.get("means", [0.0] * k)]
        stds = [float(v) for v in statistics.get("stds", [1.0] * k)]
        features: list[dict[str, Any]] = []
        numeric_at = 0
        for column in self.schema.features:
            aliases = list(column.aliases)
            if isinstance(column, Categorical):
                features.append(
                    {
                        "name": column.name,
                        "kind": "categorical",
                        "categories": list(column.categories),
                        "aliases": aliases,
                    }
                )
                continue
            mean, std = means[numeric_at], stds[numeric_at]
            numeric_at += 1
            features.append({
                "name": column.name, "kind": "numeric", "impute": column.impute,
                "clip": list(column.bounds) if column.bounds else None, "fill": mean,
                "center": mean if self.standardise else 0.0,
                "scale": std if self.standardise else 1.0, "aliases": aliases,
            })  # fmt: skip
        label = self.schema.label
        outputs: dict[str, Any] = {"kind": label.kind, "classes": list(label.classes)}
        if self._regression:
            scaled = self.standardise and "label_mean" in statistics
            outputs["label_mean"] = float(statistics["label_mean"]) if scaled else 0.0
            outputs["label_std"] = float(statistics["label_std"]) if scaled else 1.0
        return {
            "kind": "table", "features": features, "width": self.schema.width,
            "label": {"name": label.name, "aliases": list(label.aliases)}, "outputs": outputs,
        }  # fmt: skip

    def train(self, model: Any, data: Any, config: TrainConfig) -> dict[str, float]:
        return train_epochs(model, data, config, self.objective)

    def evaluate(self, model: Any, data: Any, config: TrainConfig) -> dict[str, float]:
        return evaluate_model(model, data, config, objective=self.objective)


def _impute_only(data: Table, schema: TabularSchema, means: np.ndarray) -> ArrayData:
    filled = np.where(np.isnan(data.numeric), means, data.numeric)
    k = len(means)
    return encode(Table(filled, data.categorical, data.labels, data.source), schema,
                  np.zeros(k), np.ones(k))  # fmt: skip
