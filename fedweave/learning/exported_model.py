"""A recorded run's model used on its own: ``fedweave.load_model(export_dir)``.

``fedweave history export`` writes, beside the weights (``model.safetensors``):

- ``model.pt2``: the network as a ``torch.export`` program (``torch.export.load``), so it
  runs without the task's code (any batch size);
- ``model.json`` ``preparation``: how raw columns become the network's inputs (each numeric
  column's clip bounds, fill value, centre and scale; each categorical column's categories,
  one-hot) and how its outputs become predictions (objective kind, label classes, a
  regression label's mean and deviation), as plain JSON.

``load_model`` joins the two into a ``torch.nn.Module`` that takes raw columns and gives what
``fedweave predict`` writes, computed the same way (float64 preparation, float32 network)::

    model = fedweave.load_model("export/")
    rows = model.predict(csv.DictReader(open("new.csv")))    # [{'prediction': 151.2}, ...]
    values = model(pandas.read_csv("new.csv"))               # a tensor of predictions

Why ``torch.export`` and not TorchScript or ONNX: TorchScript is deprecated in this torch,
ONNX needs packages a site may not have; a ``.pt2`` file needs torch alone. The preparation
stays outside the program because category names are text, which a tensor program cannot
take. Load only exports you trust: a ``.pt2`` file is a program.

This module uses numpy, torch and the standard library only (no training code).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedweave.errors import UserError
from fedweave.learning.decoding import decoded, prediction_rows
from fedweave.learning.tables import MISSING_TOKENS

PROGRAM_FILE = "model.pt2"
BEST_PROGRAM_FILE = "best.pt2"
META_FILE = "model.json"


def network_program(model: torch.nn.Module, input_shape: tuple[int, ...], path: Path) -> None:
    """Write ``model`` (in eval mode) as a ``torch.export`` program taking ``(batch,
    *input_shape)`` float32 inputs, any batch size."""
    from torch.export import Dim, export

    model.eval()
    example = torch.zeros((2, *input_shape), dtype=torch.float32)
    with torch.no_grad():
        program = export(model, (example,), dynamic_shapes=({0: Dim.DYNAMIC},))
    torch.export.save(program, str(path))


def _columns(table: Any) -> dict[str, list[Any]]:
    """``table`` (a pandas DataFrame, a mapping of column to values, or rows as mappings,
    e.g. ``csv.DictReader``) as column -> list of values."""
    if hasattr(table, "to_dict") and hasattr(table, "columns"):
        return {str(name): list(table[name]) for name in table.columns}
    if isinstance(table, Mapping):
        return {str(name): list(values) for name, values in table.items()}
    if isinstance(table, Iterable):
        rows = list(table)
        names = list(rows[0]) if rows else []
        return {str(name): [row.get(name) for row in rows] for name in names}
    raise UserError(
        f"cannot read columns from a {type(table).__name__}; pass a DataFrame, a mapping of "
        "column to values, or rows (csv.DictReader)"
    )


def _values(columns: dict[str, list[Any]], feature: dict[str, Any]) -> list[Any]:
    for header in (feature["name"], *feature.get("aliases", ())):
        if header in columns:
            return columns[header]
    shown = ", ".join(list(columns)[:12])
    raise UserError(f"no column '{feature['name']}' (the table has: {shown}); add it")


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def _numbers(values: list[Any], feature: dict[str, Any]) -> np.ndarray:
    numbers = np.empty(len(values), dtype=np.float64)
    for row, value in enumerate(values):
        text = _text(value)
        number = np.nan if text.lower() in MISSING_TOKENS else None
        if number is None:
            try:
                number = float(text)
            except ValueError:
                number = np.inf
            if not np.isfinite(number):
                raise UserError(
                    f"row {row + 1}, column '{feature['name']}': '{text}' is not a number"
                )
        if np.isnan(number) and not feature.get("impute"):
            raise UserError(
                f"row {row + 1}, column '{feature['name']}': missing value; the model was "
                "trained without imputing it, fill it in"
            )
        numbers[row] = number
    return numbers


def prepared_inputs(preparation: dict[str, Any], table: Any) -> np.ndarray:
    """The network's float32 inputs ``(n, width)`` for a raw ``table``, by ``preparation``
    (an exported ``model.json``'s)."""
    columns = _columns(table)
    parts = []
    for feature in preparation["features"]:
        values = _values(columns, feature)
        if feature["kind"] == "categorical":
            categories = [str(c) for c in feature["categories"]]
            one_hot = np.zeros((len(values), len(categories)))
            for row, value in enumerate(values):
                text = _text(value)
                if text not in categories:
                    raise UserError(
                        f"row {row + 1}, column '{feature['name']}': '{text}' is not one of "
                        f"the model's categories {categories}"
                    )
                one_hot[row, categories.index(text)] = 1.0
            parts.append(one_hot)
            continue
        numbers = _numbers(values, feature)
        if feature.get("clip"):
            low, high = feature["clip"]
            numbers = np.where(np.isnan(numbers), numbers, np.clip(numbers, low, high))
        numbers = np.where(np.isnan(numbers), float(feature["fill"]), numbers)
        parts.append(((numbers - float(feature["center"])) / float(feature["scale"]))[:, None])
    rows = len(parts[0]) if parts else 0
    inputs = np.concatenate(parts, axis=1) if parts else np.zeros((rows, 0))
    return inputs.astype(np.float32)


class ExportedModel(torch.nn.Module):
    """An exported run's network with its preparation: raw columns in, predictions out.

    Attributes:
        network: the network (``torch.export`` program, or the task's model when the
            export has no program), taking prepared float32 inputs.
        preparation: ``model.json``'s ``preparation``.
        meta: the whole ``model.json`` (run, round, schema, statistics, privacy).
    """

    def __init__(self, network: torch.nn.Module, meta: dict[str, Any]) -> None:
        super().__init__()
        self.network = network
        self.meta = meta
        self.preparation = meta["preparation"]
        self._outputs = self.preparation["outputs"]

    def inputs(self, table: Any) -> torch.Tensor:
        """The network's inputs for ``table``: a table task's raw columns (a DataFrame, a
        mapping of column to values, rows as mappings), else an array of examples."""
        if self.preparation["kind"] == "table":
            return torch.from_numpy(prepared_inputs(self.preparation, table))
        return torch.as_tensor(np.asarray(table, dtype=np.float32))

    def outputs(self, table: Any) -> np.ndarray:
        """The network's raw float32 outputs for ``table``."""
        with torch.no_grad():
            return self.network(self.inputs(table)).float().cpu().numpy()

    def _decoded(self, table: Any) -> np.ndarray:
        kind = self._outputs["kind"]
        scale = (self._outputs.get("label_mean", 0.0), self._outputs.get("label_std", 1.0))
        return decoded(self.outputs(table), kind, *scale)

    def forward(self, table: Any) -> torch.Tensor:
        """Predictions for ``table``: a regression's values in the label's units ``(n,)``, a
        binary task's positive-class probability ``(n,)``, a multi-class task's class
        probabilities ``(n, classes)``, a multi-label task's label probabilities."""
        return torch.from_numpy(np.asarray(self._decoded(table)))

    def predict(self, table: Any) -> list[dict[str, Any]]:
        """One dict per example with the columns ``fedweave predict`` writes (``prediction``,
        then the probabilities), class values spelled as the task's label spells them."""
        classes = tuple(self._outputs.get("classes") or ())
        header, rows = prediction_rows(self._decoded(table), self._outputs["kind"], classes)
        return [dict(zip(header, row, strict=True)) for row in rows]


def load_model(export_dir: str | Path, best: bool = False) -> ExportedModel:
    """The model ``fedweave history export`` wrote to ``export_dir`` (its final round's;
    ``best``: its best round's), ready to take raw columns (``ExportedModel``)."""
    export_dir = Path(export_dir)
    meta_path = export_dir / META_FILE
    if not meta_path.is_file():
        raise UserError(
            f"{export_dir} holds no exported model ({META_FILE} is missing); write one with "
            "fedweave history export RUN --to DIR"
        )
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if not meta.get("preparation"):
        raise UserError(
            f"{meta_path} has no preparation (task '{meta.get('task')}' prepares its data "
            "with its own code, or the export predates it); re-export with this version, or "
            "load model.safetensors into the task's build_model()"
        )
    program = export_dir / (BEST_PROGRAM_FILE if best else PROGRAM_FILE)
    if program.is_file():
        network = torch.export.load(str(program)).module()
    else:
        network = _task_network(export_dir, meta, best)
    return ExportedModel(network, meta)


def _task_network(export_dir: Path, meta: dict[str, Any], best: bool) -> torch.nn.Module:
    """The task's model with the export's weights (an export whose network could not be
    written as a program needs the task's code installed)."""
    from safetensors.torch import load_file

    from fedweave.learning.tasks import load_task

    weights = export_dir / ("best.safetensors" if best else "model.safetensors")
    if not weights.is_file():
        raise UserError(f"{weights} is missing; re-export the run")
    model = load_task(str(meta["task"])).build_model()
    model.load_state_dict(load_file(str(weights)))
    return model.eval()
