"""Optional metric mirroring: names, the missing-package message, and real backends if present."""

from __future__ import annotations

import importlib.util
from datetime import datetime, timezone
from pathlib import Path

import pytest

from fedweave.errors import UserError
from fedweave.history import RoundRecord
from fedweave.history.tracking import make_tracker, round_metrics

NOW = datetime(2026, 11, 1, tzinfo=timezone.utc)


def test_round_metrics_are_flat_numbers_prefixed_by_gossip_peer() -> None:
    record = RoundRecord(4, "peer-7", NOW, NOW, 3, 2, 1, {"train_loss": 0.25, "note": "x",
                                                         "clipped": True}, 0.5, 0.9)
    assert round_metrics(record) == {
        "peer-7/eval_loss": 0.5, "peer-7/eval_accuracy": 0.9, "peer-7/participants/replied": 2.0,
        "peer-7/participants/failed": 1.0, "peer-7/train/train_loss": 0.25}
    federated = RoundRecord(1, "coordinator", NOW, NOW, eval_accuracy=0.8)
    assert round_metrics(federated)["eval_accuracy"] == 0.8


def test_no_tracker_unknown_tracker_and_missing_package() -> None:
    assert make_tracker(None, "r1", {}) is None
    with pytest.raises(UserError, match="unknown tracker 'wandb'"):
        make_tracker("wandb", "r1", {})
    for kind, module in (("mlflow", "mlflow"), ("tensorboard", "tensorboard")):
        if importlib.util.find_spec(module) is None:
            with pytest.raises(UserError, match=f"pip install {kind}"):
                make_tracker(kind, "r1", {})


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="tensorboard is not installed (optional extra)")
def test_tensorboard_writes_event_files(tmp_path: Path) -> None:
    tracker = make_tracker("tensorboard", "r1", {"lr": 0.1}, log_dir=str(tmp_path))
    assert tracker is not None
    tracker.log_round(RoundRecord(1, "coordinator", NOW, NOW, eval_accuracy=0.5))
    tracker.close()
    assert list((tmp_path / "r1").glob("events.out.tfevents.*"))
