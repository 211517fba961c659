"""``fedweave predict``: score new data with a recorded run's final (or best) global model.

The file is read with the task's own reader (a tabular task by column name, the label
column optional), prepared with the federated statistics the run recorded, and scored by
the model loaded by tensor name (``model_export.py``); one CSV row per example.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from fedweave.history.metrics import recorded_statistics
from fedweave.history.model_export import checkpoint_weights, chosen_rounds, named_weights
from fedweave.history.store_errors import HistoryError
from fedweave.private_files import open_private


def _model_rows(store: Any, run_ref: str) -> tuple[Any, list[dict[str, Any]]]:
    """The run and the round rows of the actor whose model is used (a gossip run: the
    peer with the highest checkpointed round)."""
    info = store.get_run(run_ref)
    rows = store.rounds(info.run_id)
    actors = {row["actor"] for row in rows}
    if len(actors) > 1:
        latest = store.latest_checkpoint(info.run_id)
        if latest is not None:
            owner = next(row["actor"] for row in rows if row["checkpoint_path"] == latest.path)
            rows = [row for row in rows if row["actor"] == owner]
    return info, rows


def _read(task: Any, path: Path, label_column: str | None, columns: Path | None) -> Any:
    from fedweave.learning.data import load_site_data

    if hasattr(task, "read_new_data"):
        if columns is None:
            return task.read_new_data(path)
        from fedweave.learning.column_map import read_column_map

        return task.read_new_data(path, columns=read_column_map(columns))
    return load_site_data(path, task, label_column, columns)


def _check_schema(info: Any, task: Any) -> None:
    pinned = (info.config or {}).get("schema")
    schema = getattr(task, "schema", None)
    if pinned is None or schema is None:
        return
    if pinned.get("digest") != schema.digest():
        raise HistoryError(
            f"task '{info.task}' as installed here reads tables with schema "
            f"{schema.digest()}, the run trained on {pinned.get('digest')}; install the task "
            "code the run used"
        )


def _site_layers(info: Any, row: dict, site: str | None, path: Path | None) -> Path | None:
    """The file of one site's local layers a prediction uses (``--site``, ``--site-layers``),
    or None for a run whose task has none; refused when they do not go together."""
    local = (info.config or {}).get("local_layers")
    given = "--site" if site is not None else "--site-layers" if path is not None else None
    if not local:
        if given:
            raise HistoryError(f"run {info.run_id} keeps no layers at its sites; drop {given}")
        return None
    if site is not None and path is not None:
        raise HistoryError("give --site (a simulated site) or --site-layers FILE, not both")
    if path is not None:
        return path
    folder = Path(str(row["checkpoint_path"])).parent / "site-layers"
    if site is None:
        raise HistoryError(
            f"run {info.run_id} keeps layers {', '.join(local)} at each site: name whose to "
            "score with, --site NAME (a simulated site) or --site-layers FILE (a deployed "
            "site's RUN.safetensors in its --personal-state folder)"
        )
    found = folder / site / f"{info.run_id}.safetensors"
    if not found.is_file():
        known = sorted(p.parent.name for p in folder.glob(f"*/{info.run_id}.safetensors"))
        raise HistoryError(
            f"run {info.run_id} has no local layers of site {site!r} here; its sites' are "
            f"{', '.join(known) or 'none (a deployed run: --site-layers FILE)'}"
        )
    return found


def predict_run(
    store: Any,
    run_ref: str,
    data_path: Path,
    out: Path,
    best: bool = False,
    label_column: str | None = None,
    columns: Path | None = None,
    site: str | None = None,
    site_layers: Path | None = None,
) -> tuple[int, int]:
    """Write ``out`` (CSV: ``row``, then the prediction columns) for every example of
    ``data_path`` (its headers renamed by the column map ``columns``, as a site's);
    returns (examples, round of the model used). A run whose task keeps local layers at the
    sites scores with one site's own: simulated ``site``'s, or a site's file ``site_layers``."""
    import torch

    from fedweave.history.model_export import recorded_model
    from fedweave.learning.adapters import recorded_adapter
    from fedweave.learning.prediction import model_outputs, prediction_columns
    from fedweave.learning.statistics import prepared
    from fedweave.learning.tasks import load_task
    from fedweave.learning.training import TrainConfig

    info, rows = _model_rows(store, run_ref)
    final, best_row, chosen = chosen_rounds(info, rows)
    row = best_row if best else final
    if final is None:
        raise HistoryError(
            f"run {info.run_id} has no recorded model (no round recorded a checkpoint); "
            "pick a run that completed a round: fedweave history runs"
        )
    if row is None:
        raise HistoryError(
            f"run {info.run_id} has no best round ({chosen.get('note')}); drop --best to use "
            "its final model"
        )
    task = load_task(info.task)
    _check_schema(info, task)
    layers = _site_layers(info, row, site, site_layers)
    if layers is not None or recorded_adapter(info.config) is not None:
        model = recorded_model(info, checkpoint_weights(row), layers)
    else:
        tensors = named_weights(info.task, checkpoint_weights(row))
        model = task.build_model()
        model.load_state_dict({name: torch.from_numpy(array) for name, array in tensors.items()})
    data = prepared(task, _read(task, data_path, label_column, columns), recorded_statistics(rows))
    outputs = model_outputs(model, data, TrainConfig(device=None))
    header, values = prediction_columns(task, outputs, data)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with open_private(partial, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["row", *header])
        writer.writerows([index, *value] for index, value in enumerate(values))
    os.replace(partial, out)
    return len(values), int(row["round"])
