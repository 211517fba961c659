"""Three hospitals' CSVs on Flower's deployment engine: TLS, registered site keys and SecAgg+
on; one file with its columns in another order, one with an extra patient-id column; the
feature statistics gathered through SecAgg+ before round 1; each site's console says what it
trained and sent. The coordinator holds no data at all: every round is scored by the sites on
their own held-out parts (AUC included), and the exported model, loaded by name in plain
PyTorch, scores a held-out file as ``fedweave predict`` does. Then, with the same sites
still running, ``fedweave evaluate`` starts a new coordinator on the same address that
trains nothing: every site scores the recorded run's final (and best) model."""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest
from test_deploy_support import (
    Processes,
    free_port,
    recorded,
    register_named_sites,
    run_fedweave,
    wait_for,
    wait_for_success,
)

from fedweave.learning.tasks.breast_cancer import write_hospital_files

ROUNDS = 6


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hospital_csvs_deployed_with_tls_and_secagg(tmp_path):
    sites, test = write_hospital_files(tmp_path / "sites")
    register_named_sites(tmp_path, [path.stem for path in sites])
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port = free_port()
    procs = Processes(tmp_path)
    try:
        coord = procs.start(
            "coordinator", "coordinator", "--address", f"127.0.0.1:{port}",
            "--task", "breast-cancer", "--rounds", str(ROUNDS), "--select-metric", "auc",
            "--min-clients", "3", "--db", db, "--tls-dir", "tls", "--once",
        )  # fmt: skip
        wait_for(
            lambda: "sites connected" in procs.output("coordinator"), 60,
            "the coordinator to listen", coord, lambda: procs.output("coordinator"),
        )  # fmt: skip
        for i, path in enumerate(sites):
            procs.start(
                f"site{i}", "client", "--coordinator", f"127.0.0.1:{port}",
                "--task", "breast-cancer", "--data", str(path), "--ca-cert", "tls/ca.pem",
                "--site-key", f"site{i}.key", "--log-file", f"site{i}.log",
                "--name", path.stem,
            )  # fmt: skip
        wait_for_success(procs, coord, "the run", 480)
        rounds, site_rows, run = recorded(db)
        assert run.status == "completed" and len(rounds) == ROUNDS
        assert all(r["replied"] == 3 for r in rounds)
        for row in rounds:  # no data at the coordinator: the sites scored every round
            evaluation = row["extra"]["evaluation"]
            assert evaluation["central"] == {}
            assert sorted((s["site"], s["status"]) for s in evaluation["sites"]) == [
                (path.stem, "ok") for path in sorted(sites)
            ]
            assert row["eval_loss"] == evaluation["federated"]["loss"]
        assert rounds[-1]["extra"]["evaluation"]["federated"]["auc"] >= 0.95
        assert "statistics" in rounds[0]["extra"]
        coordinator_out = procs.output("coordinator")
        assert "SecAgg+ on" in coordinator_out and "TLS on" in coordinator_out
        assert "evaluation federated every round" in coordinator_out
        assert coordinator_out.count("federated (3/3 sites): loss") == ROUNDS
        for i in range(len(sites)):
            console = procs.output(f"site{i}")
            assert "statistics (moments) of" in console and "sent masked (SecAgg+)" in console
            assert f"round {ROUNDS}: trained on" in console, console[-2000:]
            assert f"round {ROUNDS}: evaluated the global model on" in console
        assert "ignoring column(s) the task does not use: patient_id" in procs.output("site2")
        _every_site_scores_the_recorded_run_again(procs, tmp_path, db, port, sites, run.run_id)
    finally:
        procs.close()
    _the_model_out_scores_a_held_out_file(tmp_path, db, test, run.run_id)


def _every_site_scores_the_recorded_run_again(procs, tmp_path, db, port, sites, run_id):
    """``fedweave evaluate``: the sites reconnect to its SuperLink on the same address and
    score the run's final model ("global"), and its best round's when that is another one;
    the new run records each site's figures (the task's AUC too) and the matrix, which
    ``history show`` prints; the evaluated run is unchanged."""
    from fedweave.history import open_store

    store = open_store(db)
    before = store.rounds(run_id)
    store.close()
    started = time.monotonic()
    evaluation = procs.start(
        "evaluate", "evaluate", "--run", run_id, "--address", f"127.0.0.1:{port}",
        "--min-clients", "3", "--db", db, "--tls-dir", "tls", "--round-timeout", "120",
    )  # fmt: skip
    out = wait_for_success(procs, evaluation, "the evaluation-only run", 240)
    print(f"fedweave evaluate took {time.monotonic() - started:.1f} s")
    store = open_store(db)
    try:
        assert store.rounds(run_id) == before  # the evaluated run is only read
        info = store.list_runs()[0]
        assert info.run_id != run_id and info.status == "completed", info
        assert info.config["command"] == "evaluate" and info.task == "breast-cancer"
        assert info.config["evaluated"]["run_id"] == run_id
        models = info.config["evaluated"]["models"]
        assert models["global"] == ROUNDS
        (row,) = store.rounds(info.run_id)
    finally:
        store.close()
    evaluation_row = row["extra"]["evaluation"]
    names = sorted(path.stem for path in sites)
    assert sorted(s["site"] for s in evaluation_row["sites"] if s["status"] == "ok") == names
    assert all("auc" in s["metrics"] for s in evaluation_row["sites"])
    assert row["eval_loss"] == evaluation_row["federated"]["loss"]
    assert evaluation_row["federated"]["auc"] >= 0.95 and row["replied"] == 3
    matrix = evaluation_row["cross_site"]
    assert sorted((e["model"], e["site"], e["status"]) for e in matrix) == sorted(
        (model, name, "ok") for model in models for name in names
    )
    assert all("auc" in e["metrics"] for e in matrix)
    assert f"run {info.run_id} completed" in out and "cross-site evaluation (auc" in out
    shown = run_fedweave("history", "show", info.run_id, "--db", db, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "cross-site evaluation: auc" in shown.stdout and "global" in shown.stdout
    for i, path in enumerate(sites):
        assert path.stem in shown.stdout
        scored = procs.output(f"site{i}").count("evaluated the global model on")
        assert scored == ROUNDS + len(models), procs.output(f"site{i}")[-2000:]


def _the_model_out_scores_a_held_out_file(tmp_path, db, test, run_id):
    """Exported by name, loaded in plain PyTorch with the run's statistics, it scores the
    held-out file; ``fedweave predict`` gives the same decisions."""
    from safetensors.torch import load_file

    from fedweave.learning.tasks import load_task
    from fedweave.learning.training import TrainConfig

    done = run_fedweave("history", "export", run_id, "--db", db, "--to", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "out" / "model.json").read_text())
    task = load_task("breast-cancer")
    model = task.build_model()
    model.load_state_dict(load_file(str(tmp_path / "out" / "model.safetensors")))
    data = task.prepare(task.read_site_data(test), meta["statistics"])
    scores = task.evaluate(model, data, TrainConfig())
    # a deployed site seeds its training with its node id, which differs every run, so the
    # model differs a little between runs (0.94 to 0.97 accuracy seen)
    assert scores["accuracy"] >= 0.9 and scores["auc"] >= 0.95, scores
    done = run_fedweave("predict", "--run", run_id, "--db", db, "--data", str(test),
                        "--out", "p.csv", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    predicted = pd.read_csv(tmp_path / "p.csv")["prediction"].astype(str)
    truth = pd.read_csv(test)["diagnosis"].astype(str)
    assert (predicted == truth).mean() == pytest.approx(scores["accuracy"], abs=1e-9)
