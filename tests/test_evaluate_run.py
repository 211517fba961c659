"""`fedweave evaluate --run RUN` (issue 21): what it refuses in one line before any SuperLink
starts, and the run it records (settings from the evaluated run, its models named). The
deployed evaluation itself runs in tests/test_deploy_tabular.py, after that run completes."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from test_deploy_support import free_port

from fedweave.cli import main
from fedweave.config import Resolved, RunConfig
from fedweave.coordinator.command.evaluation_setup import prepare_evaluation
from fedweave.coordinator.rounds.history_listener import HistoryRecorder
from fedweave.coordinator.rounds.round_app import initial_weights
from fedweave.history import open_store
from fedweave.history.round_summary import RoundSummary

TASK = "breast-cancer"
STORED = {
    "command": "coordinator",
    "settings": {
        "data": {"task": TASK, "label_column": "diagnosis"},
        "training": {"seed": 7, "batch_size": 16},
        "evaluation": {"select_metric": "auc", "select_mode": "auto"},
    },
    "schema": {"digest": "abc"},
}


def _round(number: int, weights: list, auc: float) -> RoundSummary:
    now = datetime.now(timezone.utc)
    return RoundSummary(
        round=number, loss=0.1, accuracy=0.9, seconds=1.0, started_at=now, ended_at=now,
        weights=weights, federated={"loss": 0.1, "accuracy": 0.9, "auc": auc},
    )  # fmt: skip


def _federated_run(db: str, tmp_path: Path, weights: list, stored=STORED, aucs=(0.9,)) -> str:
    store = open_store(db)
    try:
        run_id = store.start_run("federated", TASK, stored, 7)
        recorder = HistoryRecorder(store, run_id, tmp_path / "checkpoints")
        for number, auc in enumerate(aucs, start=1):
            recorder.on_round(_round(number, weights, auc))
        store.finish_run(run_id, "completed")
        return run_id
    finally:
        store.close()


def _evaluate(tmp_path: Path, db: str, *args: str, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        main([
            "evaluate", "--insecure", "--address", f"127.0.0.1:{free_port()}", "--db", db,
            "--state-dir", str(tmp_path / "state"), *args,
        ])  # fmt: skip
    return int(done.value.code), capsys.readouterr().err


def test_evaluate_refuses_bad_input_in_one_line_before_its_superlink_starts(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    fits = initial_weights(RunConfig.of(task=TASK, seed=0))
    store = open_store(db)
    gossip = store.start_run("gossip", TASK, {"command": "peer"}, 0)
    empty = store.start_run("federated", TASK, STORED, 0)
    private = store.start_run("federated", TASK, {
        **STORED, "settings": {**STORED["settings"], "evaluation": {"private_evaluation": True}},
    }, 0)  # fmt: skip
    store.close()
    misfit = _federated_run(db, tmp_path, [np.zeros(3, dtype=np.float32)])
    lost = _federated_run(db, tmp_path, fits)
    for path in (tmp_path / "checkpoints" / lost).iterdir():
        path.unlink()
    cases = [
        ((), "--run is required"),
        (("--run", "nope1234"), "run 'nope1234' is not in"),
        (("--run", gossip), f"run {gossip} is a gossip run"),
        (("--run", empty), f"run {empty} has no recorded model"),
        (("--run", private), "ran with --private-evaluation"),
        (("--run", misfit), f"the recorded model does not fit task '{TASK}'"),
        (("--run", lost), "cannot be read"),
    ]
    for args, expected in cases:
        code, err = _evaluate(tmp_path, db, *args, capsys=capsys)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2, (args, err)
        assert len(lines) == 1 and expected in lines[0], (args, err)
    assert not (tmp_path / "state").exists()  # no SuperLink was started
    store = open_store(db)
    assert len(store.list_runs()) == 5  # nothing recorded for a refused evaluation
    store.close()


def test_the_evaluation_run_takes_its_settings_and_models_from_the_evaluated_run(tmp_path):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    start = initial_weights(RunConfig.of(task=TASK, seed=0))
    evaluated = _federated_run(db, tmp_path, start, aucs=(0.99, 0.95))
    store = open_store(db)
    try:
        plan = prepare_evaluation(
            store, RunConfig.of(run="latest", checkpoint_dir=tmp_path / "c"),
            Resolved("evaluate"), tls=False, site_authentication=False,
        )  # fmt: skip
        config = plan.config
        assert config.evaluation.run == evaluated and config.data.task == TASK
        assert (config.data.label_column, config.training.seed) == ("diagnosis", 7)
        assert config.training.batch_size == 16 and config.evaluation.select_metric == "auc"
        assert config.federation.round_timeout == 300 and config.training.rounds == 1
        info = store.get_run(plan.run_id)
        assert info.mode == "federated" and info.task == TASK and info.status == "running"
        assert info.config["command"] == "evaluate" and info.config["schema"] == {"digest": "abc"}
        assert info.config["evaluated"]["run_id"] == evaluated
        assert info.config["evaluated"]["models"] == {"global": 2, "best-round-1": 1}
        assert info.config["settings"]["evaluation"]["select_metric"] == "auc"
        # an explicit --batch-size wins over the evaluated run's
        plan = prepare_evaluation(
            store, RunConfig.of(run=evaluated, batch_size=64, round_timeout=20.0),
            Resolved("evaluate", frozenset({"batch_size", "round_timeout"})),
            tls=True, site_authentication=True,
        )  # fmt: skip
        assert plan.config.training.batch_size == 64
        assert plan.config.federation.round_timeout == 20
        assert store.rounds(evaluated)[-1]["round"] == 2  # the evaluated run is only read
    finally:
        store.close()
