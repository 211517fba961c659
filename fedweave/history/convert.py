"""Conversions between records, ORM rows and plain dicts (JSON-safe values in, dicts out)."""

from __future__ import annotations

import math
from datetime import date, datetime
from pathlib import PurePath
from typing import Any

from fedweave.history.models import Checkpoint, Round, Run, SiteRow
from fedweave.history.records import (
    CheckpointRef,
    RoundInFlight,
    RoundRecord,
    RunInfo,
    SiteResult,
    SitesWait,
)


def jsonable(value: Any) -> Any:
    """``value`` made storable as JSON on every backend.

    NumPy scalars/arrays become Python numbers/lists, paths and datetimes text, NaN and
    infinities None (PostgreSQL's JSON rejects them), anything else its ``str``. Training
    code can then hand over metrics as they come without crashing the round write.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, PurePath):
        return str(value)
    if hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy scalar or array
        return jsonable(value.tolist())
    return str(value)


def finite_or_none(value: float | None) -> float | None:
    """A float column value: NaN/inf become None (SQLite would store NULL anyway)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def run_info(run: Run, rounds_completed: int, actors: int) -> RunInfo:
    """The public view of a run row."""
    return RunInfo(
        run_id=run.run_id,
        mode=run.mode,
        task=run.task,
        status=run.status,
        config=dict(run.config or {}),
        seed=run.seed,
        code_version=run.code_version,
        started_at=run.started_at,
        ended_at=run.ended_at,
        reason=run.reason,
        rounds_completed=rounds_completed,
        pid=run.pid,
        hostname=run.hostname,
        heartbeat_at=run.heartbeat_at,
        actors=actors,
        round_in_flight=round_in_flight(run.round_in_flight),
        sites_wait=sites_wait((run.round_in_flight or {}).get("waiting")),
    )


def sites_wait(value: dict[str, Any] | None) -> SitesWait | None:
    """The stored wait for sites (``runs.round_in_flight["waiting"]``) as a record (``None``
    when unset or unreadable)."""
    if not value:
        return None
    try:
        return SitesWait(
            since=datetime.fromisoformat(value["since"]),
            connected=int(value["connected"]),
            needed=int(value["needed"]),
            missing=tuple(str(name) for name in value.get("missing", ())),
            gives_up_at=datetime.fromisoformat(value["gives_up_at"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def round_in_flight(value: dict[str, Any] | None) -> RoundInFlight | None:
    """The stored ``runs.round_in_flight`` as a record (``None`` when unset or unreadable)."""
    if not value:
        return None
    try:
        deadline = value.get("deadline_seconds")
        return RoundInFlight(
            round=int(value["round"]),
            started_at=datetime.fromisoformat(value["started_at"]),
            deadline_seconds=None if deadline is None else float(deadline),
            sampled=int(value.get("sampled", 0)),
            connected=int(value.get("connected", 0)),
        )
    except (KeyError, TypeError, ValueError):
        return None


def round_dict(row: Round, checkpoint: Checkpoint | None) -> dict[str, Any]:
    """One round row as a plain dict (datetimes stay datetimes, UTC-aware)."""
    return {
        "run_id": row.run_id,
        "actor": row.actor,
        "round": row.round,
        "started_at": row.started_at,
        "ended_at": row.ended_at,
        "seconds": (row.ended_at - row.started_at).total_seconds(),
        "sampled": row.sampled,
        "replied": row.replied,
        "failed": row.failed,
        "train_metrics": dict(row.train_metrics or {}),
        "eval_loss": row.eval_loss,
        "eval_accuracy": row.eval_accuracy,
        "model_sha256": row.model_sha256,
        "bytes_in": row.bytes_in,
        "bytes_out": row.bytes_out,
        "extra": dict(row.extra or {}),
        "checkpoint_path": checkpoint.path if checkpoint else None,
        "checkpoint_sha256": checkpoint.sha256 if checkpoint else None,
        "checkpoint_size_bytes": checkpoint.size_bytes if checkpoint else None,
    }


def site_dict(site: SiteRow, run_id: str, actor: str, round_number: int) -> dict[str, Any]:
    """One site result as a plain dict, with the run, actor and round it belongs to."""
    return {
        "run_id": run_id,
        "actor": actor,
        "round": round_number,
        "site_id": site.site_id,
        "status": site.status,
        "num_examples": site.num_examples,
        "metrics": dict(site.metrics or {}),
        "seconds": site.seconds,
        "reason": site.reason,
    }


def round_row(run_id: str, record: RoundRecord, sites: list[SiteResult],
              checkpoint: CheckpointRef | None) -> Round:
    """The ORM rows (round + sites + checkpoint) for one recorded round, JSON made safe."""
    extra = jsonable(record.extra)
    nonfinite = {name: str(value) for name, value in
                 (("eval_loss", record.eval_loss), ("eval_accuracy", record.eval_accuracy))
                 if value is not None and finite_or_none(value) is None}
    if nonfinite:  # keep the fact that evaluation diverged; the column holds NULL
        extra["nonfinite"] = nonfinite
    row = Round(
        run_id=run_id, actor=record.actor, round=record.round,
        started_at=record.started_at, ended_at=record.ended_at,
        sampled=record.sampled, replied=record.replied, failed=record.failed,
        train_metrics=jsonable(record.train_metrics),
        eval_loss=finite_or_none(record.eval_loss),
        eval_accuracy=finite_or_none(record.eval_accuracy),
        model_sha256=record.model_sha256, bytes_in=record.bytes_in,
        bytes_out=record.bytes_out, extra=extra,
    )
    row.sites = [SiteRow(
        site_id=site.site_id, status=site.status, num_examples=site.num_examples,
        metrics=jsonable(site.metrics), seconds=finite_or_none(site.seconds),
        reason=site.reason,
    ) for site in sites]
    if checkpoint is not None:
        row.checkpoint = Checkpoint(path=str(checkpoint.path), sha256=checkpoint.sha256,
                                    size_bytes=checkpoint.size_bytes)
    return row
