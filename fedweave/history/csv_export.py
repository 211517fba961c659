"""Flat tables of a run (CSV/JSON) and the export folder, shared by ``show`` and ``export``.

Metrics dicts become one column each (``train.loss``, ``metrics.accuracy``) so a
spreadsheet or pandas can use them directly; the columns are the union over all rows.
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from fedweave.errors import UserError
from fedweave.history.metrics import (
    final_metrics,
    metric_names,
    recorded_headline,
    round_metrics,
    site_evaluations,
)
from fedweave.history.records import RunInfo
from fedweave.history.store import HistoryStore
from fedweave.history.store_errors import HistoryError
from fedweave.private_files import create_private, open_private, write_private_text

ROUND_COLUMNS = [
    "actor",
    "round",
    "started_at",
    "ended_at",
    "seconds",
    "sampled",
    "replied",
    "failed",
    "eval_loss",
    "eval_accuracy",
    "model_sha256",
    "bytes_in",
    "bytes_out",
    "checkpoint_path",
    "checkpoint_sha256",
]
SITE_COLUMNS = ["actor", "round", "site_id", "status", "num_examples", "seconds", "reason"]
EVALUATION_COLUMNS = ["actor", "round", "site_id", "status", "num_examples", "reason"]


def plain(value: Any) -> Any:
    """``value`` with datetimes as ISO-8601 text, recursively (for JSON output)."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def run_dict(info: RunInfo) -> dict[str, Any]:
    """A run as JSON-ready dict."""
    return plain(asdict(info))


def _flatten(
    rows: list[dict[str, Any]],
    base: list[str],
    nested: str,
    prefix: str,
) -> tuple[list[str], list[dict[str, Any]]]:
    keys = sorted({key for row in rows for key in row[nested]})
    columns = base + [f"{prefix}.{key}" for key in keys]
    flat = []
    for row in rows:
        out = {column: plain(row.get(column)) for column in base}
        out.update({f"{prefix}.{key}": row[nested].get(key) for key in keys})
        flat.append(out)
    return columns, flat


def rounds_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Round rows flattened: fixed columns, ``train.*``, ``central.*`` and ``federated.*``
    metrics named as the plot, the dashboard and ``history show`` name them
    (``fedweave/history/metrics.py``: a site's ``train_loss`` is ``train.loss``), then
    ``extra`` as JSON text."""
    flat = [{column: plain(row.get(column)) for column in ROUND_COLUMNS} for row in rows]
    names = metric_names(rows)
    trained = [name for name in names if name.startswith("train.")]
    evaluated = [name for name in names if name.split(".", 1)[0] in ("central", "federated")]
    for out, row in zip(flat, rows, strict=True):
        found = round_metrics(row)
        out.update({name: found.get(name) for name in (*trained, *evaluated)})
        out["extra"] = json.dumps(row["extra"], sort_keys=True) if row["extra"] else ""
    return ROUND_COLUMNS + trained + evaluated + ["extra"], flat


def evaluations_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Each site's federated evaluation per round: actor, round, site, status, examples,
    reason, then ``metrics.*``."""
    flat = [
        {
            "actor": row["actor"],
            "round": row["round"],
            "site_id": site.get("site"),
            "status": site.get("status"),
            "num_examples": site.get("examples"),
            "reason": site.get("reason"),
            "metrics": site.get("metrics") or {},
        }
        for row in rows
        for site in site_evaluations(row)
    ]
    return _flatten(flat, EVALUATION_COLUMNS, "metrics", "metrics")


def sites_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Site rows flattened: fixed columns, then ``metrics.*``."""
    return _flatten(rows, SITE_COLUMNS, "metrics", "metrics")


def write_csv(stream: IO[str], columns: list[str], rows: list[dict[str, Any]]) -> None:
    """CSV with a header; missing values are empty cells."""
    writer = csv.DictWriter(stream, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)


def _named_models(
    info: RunInfo, rows: list[dict[str, Any]], out_dir: Path, checkpoint: Any
) -> list[Path]:
    """The final and best model as safetensors (``model_export.py``), for the actor whose
    final checkpoint is exported."""
    from fedweave.history.metrics import recorded_statistics
    from fedweave.history.model_export import export_models

    actor_rows = [row for row in rows if row.get("checkpoint_path")]
    final = next((row for row in actor_rows if row["checkpoint_path"] == checkpoint.path), None)
    if final is not None:
        actor_rows = [row for row in actor_rows if row["actor"] == final["actor"]]
    return export_models(info, actor_rows, out_dir, recorded_statistics(rows))


def export_run(
    store: HistoryStore,
    run_ref: str,
    out_dir: Path,
    actor: str | None = None,
    notes: list[str] | None = None,
) -> list[Path]:
    """Write rounds.csv, sites.csv, evaluations.csv (sites' federated evaluations, when the
    run has some), run.json, model.npz (final checkpoint) and the named model
    (model.safetensors, best.safetensors, model.json) to ``out_dir``. ``run.json`` carries
    the run's ``headline`` metric and the ``final_metrics`` of its last round's model.

    The tables are written first, so a missing or altered checkpoint file (``UserError``)
    still leaves them in place. ``actor``: whose final checkpoint (a gossip run's peers each
    have their own; default: the highest round of any). Returns the files written; what
    could not be written without failing the export (the named model, when the task is not
    installed here as the run had it) is appended to ``notes``.
    """
    info = store.get_run(run_ref)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    all_rounds = store.rounds(info.run_id)
    tables = [
        ("rounds.csv", rounds_table(all_rounds)),
        ("sites.csv", sites_table(store.site_results(info.run_id))),
    ]
    if any(site_evaluations(row) for row in all_rounds):
        tables.append(("evaluations.csv", evaluations_table(all_rounds)))
    for name, (columns, rows) in tables:
        with open_private(out_dir / name, "w", encoding="utf-8", newline="") as handle:
            write_csv(handle, columns, rows)
        written.append(out_dir / name)
    if actor is not None and not store.rounds(info.run_id, actor=actor):
        raise HistoryError(f"run {info.run_id} has no rounds of actor '{actor}'; see the actor "
                           f"column of `fedweave history show {info.run_id}`")  # fmt: skip
    checkpoint = store.latest_checkpoint(info.run_id, actor=actor)
    meta = run_dict(info)
    meta["final_checkpoint"] = asdict(checkpoint) if checkpoint else None
    # as a simulation's report.json says them: the run's headline metric, the final model's
    meta["headline"] = recorded_headline(all_rounds)
    meta["final_metrics"] = final_metrics(all_rounds)
    write_private_text(out_dir / "run.json", json.dumps(meta, indent=2, sort_keys=True) + "\n")
    written.append(out_dir / "run.json")
    if checkpoint is None:
        return written
    source = Path(checkpoint.path)
    if not source.is_file():
        raise HistoryError(
            f"checkpoint {source} of round {checkpoint.round} is missing (tables were written "
            f"to {out_dir}); copy the file back or export from the machine that has it"
        )
    target = out_dir / "model.npz"
    create_private(target)
    shutil.copyfile(source, target)
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    if digest != checkpoint.sha256:
        target.unlink()
        raise HistoryError(
            f"checkpoint {source} does not match the sha256 recorded for round "
            f"{checkpoint.round} (tables were written to {out_dir}); the file was changed"
        )
    written.append(target)
    try:
        written += _named_models(info, store.rounds(info.run_id, actor=actor), out_dir, checkpoint)
    except UserError as exc:  # the task is not installed here, or its model differs
        if notes is not None:
            notes.append(f"model.safetensors not written: {exc}")
    return written
