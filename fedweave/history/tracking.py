"""Optional mirroring of round metrics to MLflow or TensorBoard (extras, never required).

The SQL history stays the record of truth; a tracker only copies each round's metrics to a
tool people already look at. Both backends are imported on demand, and a missing package is
a ``UserError`` naming the ``pip install`` that fixes it (``check_tracker`` says so before a
run starts; ``make_tracker`` again when it builds one).

    check_tracker("tensorboard")  # a CLI's pre-flight: nothing started yet
    tracker = make_tracker("tensorboard", run_id, config, log_dir="runs/tb")
    ...
    store.record_round(run_id, record, sites, checkpoint)
    if tracker:
        tracker.log_round(record)
    ...
    tracker.close()

Metric names (the step is the round number); every numeric metric the round recorded, read
by ``fedweave/history/metrics.py`` as ``fedweave history show``/``plot``/``export`` read it:

- ``eval_loss``, ``eval_accuracy``: the round's headline figures (central evaluation when the
  coordinator has test data, else federated; a gossip peer's own evaluation);
- ``central.<metric>``: the coordinator's evaluation on its test data (``central.loss``;
  a gossip peer's own evaluation, as ``fedweave history show`` names it too);
- ``federated.<metric>``: the sites' evaluations, weighted by examples (``federated.auc``);
- ``train.<metric>``: the aggregated training metrics, ``train_`` dropped (``train.loss``);
- ``site/<site>/<metric>``: each site's own evaluation, for sites whose evaluation succeeded;
- ``participants/replied``, ``participants/failed``: sites (or gossip neighbours) that
  answered and that did not.

A gossip peer's names are prefixed by its peer id (``peer-3/eval_loss``). Characters MLflow
refuses in a name (anything but letters, digits, ``_ - . : /`` and space) become ``_`` in
site names and metric names.
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

from fedweave.errors import UserError
from fedweave.extras import require
from fedweave.history.metrics import round_metrics as recorded_metrics
from fedweave.history.metrics import site_metrics
from fedweave.history.records import COORDINATOR_ACTOR, RoundRecord

TRACKERS = ("mlflow", "tensorboard")

_UNSAFE = re.compile(r"[^\w.\- :]")
"""What a name part may not hold: MLflow's metric names allow word characters, ``.``, ``-``,
space, ``:`` and ``/``; ``/`` separates the parts here, so a site named ``a/b`` is ``a_b``."""


class RoundTracker(Protocol):
    """What the training loops call after each recorded round."""

    def log_round(self, record: RoundRecord) -> None: ...

    def close(self) -> None: ...


def _part(name: str) -> str:
    return _UNSAFE.sub("_", name)


def round_metrics(record: RoundRecord) -> dict[str, float]:
    """Every numeric metric of ``record`` by the names in this module's docstring, e.g.
    ``federated.auc``, ``site/hospital-a/loss``, ``peer-3/eval_loss``; non-numbers dropped."""
    row = {
        "round": record.round,
        "actor": record.actor,
        "eval_loss": record.eval_loss,
        "eval_accuracy": record.eval_accuracy,
        "train_metrics": record.train_metrics,
        "extra": record.extra,
    }  # a round as ``store.rounds`` returns it, so the one reader reads it
    values: dict[str, Any] = {
        "eval_loss": record.eval_loss,
        "eval_accuracy": record.eval_accuracy,
        "participants/replied": record.replied,
        "participants/failed": record.failed,
    }
    values.update({_part(name): value for name, value in recorded_metrics(row).items()})
    for site, metrics in site_metrics(row).items():
        values.update({f"site/{_part(site)}/{_part(k)}": v for k, v in metrics.items()})
    prefix = "" if record.actor == COORDINATOR_ACTOR else f"{_part(record.actor)}/"
    return {
        f"{prefix}{name}": float(value)
        for name, value in values.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class MlflowTracker:
    """One MLflow run per fedweave run; steps are round numbers."""

    def __init__(
        self,
        run_id: str,
        config: dict[str, Any],
        tracking_uri: str | None = None,
        experiment: str = "fedweave",
    ) -> None:
        """``run_id``: the fedweave run (the MLflow run's name and ``fedweave.run_id`` tag);
        ``config``: the run's stored config, logged as parameters; ``tracking_uri``: where
        MLflow keeps runs (default: ``MLFLOW_TRACKING_URI``, else MLflow's local default);
        ``experiment``: the MLflow experiment the run goes in."""
        import mlflow

        self._mlflow = mlflow
        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_experiment(experiment)
        self._run = mlflow.start_run(run_name=run_id)
        mlflow.log_params(
            {k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in config.items()}
        )
        mlflow.set_tag("fedweave.run_id", run_id)

    def log_round(self, record: RoundRecord) -> None:
        self._mlflow.log_metrics(round_metrics(record), step=record.round)

    def close(self) -> None:
        self._mlflow.end_run()


class TensorBoardTracker:
    """Scalars under ``log_dir/<run_id>``; steps are round numbers."""

    def __init__(
        self,
        run_id: str,
        config: dict[str, Any],
        log_dir: str = "runs/tensorboard",
    ) -> None:
        """``run_id``: the fedweave run (its event files go in ``log_dir/<run_id>``);
        ``config``: the run's stored config, written once as text; ``log_dir``: the folder
        ``tensorboard --logdir`` is pointed at (relative to the working directory)."""
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=f"{log_dir}/{run_id}")
        self._writer.add_text("config", json.dumps(config, indent=2, default=str))

    def log_round(self, record: RoundRecord) -> None:
        for name, value in round_metrics(record).items():
            self._writer.add_scalar(name, value, global_step=record.round)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def check_tracker(kind: str | None) -> None:
    """Raise the ``UserError`` that ``make_tracker(kind, ...)`` would for an unknown tracker
    or a missing package, without importing or starting anything: for a command's checks
    before it starts a run (``kind``: ``"mlflow"``, ``"tensorboard"`` or None for none)."""
    if not kind:
        return
    if kind not in TRACKERS:
        raise UserError(f"unknown tracker '{kind}'; choose one of {', '.join(TRACKERS)}")
    require(kind, f"tracking with {kind}")


def make_tracker(
    kind: str | None, run_id: str, config: dict[str, Any], **options: Any
) -> RoundTracker | None:
    """The tracker named ``kind`` (``"mlflow"``, ``"tensorboard"``), or None for no tracking.

    ``run_id``: the fedweave run; ``config``: its stored config (logged with the run);
    ``options`` go to the tracker: ``tracking_uri``/``experiment`` (MLflow), ``log_dir``
    (TensorBoard, default ``runs/tensorboard``).
    """
    check_tracker(kind)
    if not kind:
        return None
    try:
        if kind == "mlflow":
            return MlflowTracker(run_id, config, **options)
        return TensorBoardTracker(run_id, config, **options)
    except ImportError as exc:  # installed but does not import (say a broken dependency)
        raise UserError(
            f"tracking with {kind}: the package is installed but does not import ({exc}); "
            f"reinstall it: pip install --force-reinstall 'fedweave[{kind}]'"
        ) from None
