"""Optional metric mirroring: names, the missing-package message, and real backends if present."""

from __future__ import annotations

import importlib.util
from datetime import datetime, timezone
from pathlib import Path

import pytest
from test_deploy_support import run_fedweave

from fedweave.errors import UserError
from fedweave.history import RoundRecord
from fedweave.history.tracking import check_tracker, make_tracker, round_metrics

NOW = datetime(2026, 11, 1, tzinfo=timezone.utc)

EVALUATED = RoundRecord(
    3, "coordinator", NOW, NOW, sampled=3, replied=2, failed=1,
    train_metrics={"train_loss": 0.4, "note": "x"}, eval_loss=0.3, eval_accuracy=0.9,
    extra={"seconds": 2.5, "evaluation": {
        "central": {"loss": 0.3, "accuracy": 0.9},
        "federated": {"loss": 0.35, "auc": 0.97, "flagged": True},
        "sites": [
            {"site": "hospital-a", "status": "ok", "examples": 40,
             "metrics": {"loss": 0.3, "auc": 0.99, "model": "v2"}},
            {"site": "clinic/b", "status": "ok", "examples": 10, "metrics": {"auc": 0.9}},
            {"site": "late-site", "status": "late", "examples": 0, "metrics": {"auc": 0.1},
             "reason": "no reply by the round deadline"},
        ],
    }},
)  # fmt: skip


def test_round_metrics_mirror_every_recorded_evaluation_metric() -> None:
    assert round_metrics(EVALUATED) == {
        "eval_loss": 0.3,
        "eval_accuracy": 0.9,
        "participants/replied": 2.0,
        "participants/failed": 1.0,
        "central.loss": 0.3,
        "central.accuracy": 0.9,
        "federated.loss": 0.35,
        "federated.auc": 0.97,
        "train.loss": 0.4,
        "site/hospital-a/loss": 0.3,
        "site/hospital-a/auc": 0.99,
        "site/clinic_b/auc": 0.9,
    }


def test_round_metrics_are_flat_numbers_prefixed_by_gossip_peer() -> None:
    record = RoundRecord(
        4, "peer-7", NOW, NOW, 3, 2, 1, {"train_loss": 0.25, "note": "x", "clipped": True}, 0.5, 0.9
    )
    assert round_metrics(record) == {
        "peer-7/eval_loss": 0.5,
        "peer-7/eval_accuracy": 0.9,
        "peer-7/central.loss": 0.5,
        "peer-7/central.accuracy": 0.9,
        "peer-7/participants/replied": 2.0,
        "peer-7/participants/failed": 1.0,
        "peer-7/train.loss": 0.25,
    }
    federated = RoundRecord(1, "coordinator", NOW, NOW, eval_accuracy=0.8)
    assert round_metrics(federated)["eval_accuracy"] == 0.8


def test_no_tracker_unknown_tracker_and_missing_package() -> None:
    assert make_tracker(None, "r1", {}) is None
    check_tracker(None)
    with pytest.raises(UserError, match="unknown tracker 'wandb'"):
        make_tracker("wandb", "r1", {})
    for kind in ("mlflow", "tensorboard"):
        if importlib.util.find_spec(kind) is None:
            with pytest.raises(UserError, match=rf"pip install 'fedweave\[{kind}\]'"):
                check_tracker(kind)
            with pytest.raises(UserError, match=rf"pip install 'fedweave\[{kind}\]'"):
                make_tracker(kind, "r1", {})
        else:
            check_tracker(kind)


@pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is not None,
    reason="mlflow is installed: nothing to refuse",
)
def test_coordinator_refuses_track_without_the_package_before_starting(tmp_path: Path) -> None:
    done = run_fedweave(
        "coordinator", "--insecure", "--track", "mlflow", "--once",
        "--db", f"sqlite:///{tmp_path / 'h.db'}", "--state-dir", str(tmp_path / "state"),
        cwd=tmp_path,
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert lines == [
        "error: tracking with mlflow needs the mlflow extra (mlflow not installed): "
        "pip install 'fedweave[mlflow]'"
    ], done.stderr
    assert not (tmp_path / "h.db").exists() and not (tmp_path / "state").exists()


@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None,
    reason="tensorboard is not installed (optional extra)",
)
def test_tensorboard_writes_every_metric_to_event_files(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = make_tracker("tensorboard", "r1", {"lr": 0.1}, log_dir=str(tmp_path))
    assert tracker is not None
    tracker.log_round(RoundRecord(1, "coordinator", NOW, NOW, eval_accuracy=0.5))
    tracker.log_round(EVALUATED)
    tracker.close()
    assert list((tmp_path / "r1").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tmp_path / "r1"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"eval_accuracy", "federated.auc", "site/hospital-a/auc", "train.loss"} <= scalars
    (auc,) = events.Scalars("federated.auc")
    assert (auc.step, auc.value) == (3, pytest.approx(0.97))
    assert [(e.step, e.value) for e in events.Scalars("eval_accuracy")] == [
        (1, 0.5),
        (3, pytest.approx(0.9)),
    ]


def test_deployed_plan_carries_track_to_the_server_app() -> None:
    from fedweave.config import RunConfig
    from fedweave.contract import RUN_ID_KEY
    from fedweave.coordinator.plan import DeployPlan

    plan = DeployPlan("r1", RunConfig().replace(track="tensorboard"))
    back = DeployPlan.from_run_config(plan.to_run_config())
    assert back.config.history.track == "tensorboard"
    assert DeployPlan.from_run_config({RUN_ID_KEY: "r2"}).config.history.track is None
