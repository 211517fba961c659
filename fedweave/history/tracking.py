"""Optional mirroring of round metrics to MLflow or TensorBoard (extras, never required).

The SQL history stays the record of truth; a tracker only copies each round's metrics to a
tool people already look at. Both backends are imported on demand, and a missing package is
a ``UserError`` naming the ``pip install`` that fixes it.

    tracker = make_tracker("tensorboard", run_id, config, log_dir="runs/tb")
    ...
    store.record_round(run_id, record, sites, checkpoint)
    if tracker:
        tracker.log_round(record)
    ...
    tracker.close()
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from fedweave.errors import UserError
from fedweave.history.records import COORDINATOR_ACTOR, RoundRecord

TRACKERS = ("mlflow", "tensorboard")


class RoundTracker(Protocol):
    """What the training loops call after each recorded round."""

    def log_round(self, record: RoundRecord) -> None: ...

    def close(self) -> None: ...


def round_metrics(record: RoundRecord) -> dict[str, float]:
    """Numeric metrics of a round as flat names; gossip names are prefixed by the peer id.

    e.g. ``eval_accuracy``, ``train/train_loss``, ``peer-3/eval_loss``; non-numbers dropped.
    """
    values: dict[str, Any] = {"eval_loss": record.eval_loss,
                              "eval_accuracy": record.eval_accuracy,
                              "participants/replied": record.replied,
                              "participants/failed": record.failed}
    values.update({f"train/{k}": v for k, v in record.train_metrics.items()})
    prefix = "" if record.actor == COORDINATOR_ACTOR else f"{record.actor}/"
    return {f"{prefix}{name}": float(value) for name, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


class MlflowTracker:
    """One MLflow run per fedweave run; steps are round numbers."""

    def __init__(self, run_id: str, config: dict[str, Any], tracking_uri: str | None = None,
                 experiment: str = "fedweave") -> None:
        import mlflow

        self._mlflow = mlflow
        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_experiment(experiment)
        self._run = mlflow.start_run(run_name=run_id)
        mlflow.log_params({k: json.dumps(v) if isinstance(v, (dict, list)) else v
                           for k, v in config.items()})
        mlflow.set_tag("fedweave.run_id", run_id)

    def log_round(self, record: RoundRecord) -> None:
        self._mlflow.log_metrics(round_metrics(record), step=record.round)

    def close(self) -> None:
        self._mlflow.end_run()


class TensorBoardTracker:
    """Scalars under ``log_dir/<run_id>``; steps are round numbers."""

    def __init__(self, run_id: str, config: dict[str, Any], log_dir: str = "runs/tensorboard",
                 ) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=f"{log_dir}/{run_id}")
        self._writer.add_text("config", json.dumps(config, indent=2, default=str))

    def log_round(self, record: RoundRecord) -> None:
        for name, value in round_metrics(record).items():
            self._writer.add_scalar(name, value, global_step=record.round)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def make_tracker(kind: str | None, run_id: str, config: dict[str, Any],
                 **options: Any) -> RoundTracker | None:
    """The tracker named ``kind`` (``"mlflow"``, ``"tensorboard"``), or None for no tracking.

    ``options`` go to the tracker: ``tracking_uri``/``experiment`` (MLflow), ``log_dir``
    (TensorBoard, default ``runs/tensorboard``).
    """
    if not kind:
        return None
    if kind not in TRACKERS:
        raise UserError(f"unknown tracker '{kind}'; choose one of {', '.join(TRACKERS)}")
    try:
        if kind == "mlflow":
            return MlflowTracker(run_id, config, **options)
        return TensorBoardTracker(run_id, config, **options)
    except ImportError:
        raise UserError(f"tracking with {kind} needs the '{kind}' package; "
                        f"run `pip install {kind}` or leave tracking off") from None
