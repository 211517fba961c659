"""Simulated stragglers (FedProx paper): a seeded share of each round's sampled sites finish
only part of their local work; FedProx aggregates it, FedAvg records them late."""

import json

import numpy as np
import pytest
import torch
from test_simulation_federated import run_cli

from fedweave.coordinator.rounds.stragglers import MIN_WORK_FRACTION, pick_stragglers
from fedweave.learning.task import ArrayData
from fedweave.learning.training import TrainConfig, train_epochs


def test_the_same_seed_and_round_pick_the_same_stragglers():
    picked = pick_stragglers(10, 0.5, seed=3, server_round=2)
    assert len(picked) == 5 and picked == pick_stragglers(10, 0.5, seed=3, server_round=2)
    assert picked != pick_stragglers(10, 0.5, seed=3, server_round=3)
    assert all(MIN_WORK_FRACTION <= share < 1 for share in picked.values())
    assert pick_stragglers(10, 0.0, seed=3, server_round=2) == {}


def test_partial_work_runs_that_share_of_the_steps():
    data = ArrayData(np.random.default_rng(0).normal(size=(160, 4)).astype(np.float32),
                     np.arange(160) % 2)  # fmt: skip
    models = {}
    for work in (1.0, 0.25, 0.001):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        steps = []
        model.register_forward_hook(lambda *_, seen=steps: seen.append(1))
        train_epochs(model, data, TrainConfig(epochs=2, batch_size=16, work_fraction=work))
        models[work] = len(steps)
    assert models == {1.0: 20, 0.25: 5, 0.001: 1}  # 2 epochs x 10 batches, at least one step


def _simulate(tmp_path, strategy: str, *extra: str):
    out = tmp_path / f"{strategy}.json"
    db = f"sqlite:///{tmp_path / 'h.db'}"
    result = run_cli(
        "simulate", "--task", "synthetic-1-1", "--clients", "12", "--clients-per-round", "6",
        "--rounds", "2", "--lr", "0.01", "--no-secure-agg", "--stragglers", "0.5",
        "--strategy", strategy, "--proximal-mu", "1", "--out", str(out), "--db", db, *extra,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    from fedweave.history import open_store

    store = open_store(db)
    run = store.list_runs()[0]
    sites = store.site_results(run.run_id)
    store.close()
    return json.loads(out.read_text()), sites, result.stderr


@pytest.mark.slow
def test_fedavg_drops_stragglers_as_late_and_fedprox_keeps_their_work(tmp_path):
    report, sites, said = _simulate(tmp_path, "fedavg")
    assert "simulated stragglers 50% a round (dropped as late)" in said
    assert [row["replied"] for row in report["rounds"]] == [3, 3]
    late = [s for s in sites if s["status"] == "late"]
    assert len(late) == 6 and all("simulated straggler" in s["reason"] for s in late)
    assert all("\\n" not in s["reason"] and "Traceback" not in s["reason"] for s in late)
    assert "Traceback" not in said

    report, sites, said = _simulate(tmp_path, "fedprox")
    assert "(partial work counts)" in said
    assert [row["replied"] for row in report["rounds"]] == [6, 6]
    assert {s["status"] for s in sites} == {"ok"}


def test_more_stragglers_than_secagg_survives_are_refused(tmp_path):
    result = run_cli(
        "simulate", "--task", "synthetic-1-1", "--clients", "10", "--stragglers", "0.5",
        "--db", f"sqlite:///{tmp_path / 'h.db'}", "--out", str(tmp_path / "r.json"),
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "drops 5 of the 10 sites" in result.stderr and "--strategy fedprox" in result.stderr
    gossip = run_cli("simulate", "--mode", "gossip", "--stragglers", "0.2", cwd=tmp_path,
                     timeout=120)  # fmt: skip
    assert gossip.returncode == 2 and "--stragglers is for federated" in gossip.stderr


def test_a_round_in_flight_notes_the_sample_size_through_the_straggler_wrapper():
    """The history's round in flight says how many sites a round samples (``ReportingStrategy``
    asks its strategy's ``num_fit_clients``); wrapped for stragglers, it read the connected
    count instead."""
    from fedweave.coordinator.rounds.strategies import make_strategy

    common = {"fraction_fit": 0.5, "min_fit_clients": 2, "evaluator": None}
    plain = make_strategy("fedavg", False, **common)
    wrapped = make_strategy("fedavg", False, stragglers=0.2, **common)
    assert wrapped.strategy.num_fit_clients(10) == plain.strategy.num_fit_clients(10) == (5, 2)
