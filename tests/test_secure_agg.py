"""SecAgg+ and update validation on real Flower simulations (Ray engine, real digits data)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fault_tasks import bad_site_index

from fedweave.client.site_app import TaskClient
from fedweave.config import RunConfig
from fedweave.config.cohorts import derive_shares
from fedweave.config.commands import check_settings
from fedweave.coordinator.rounds.history_listener import HistoryRecorder
from fedweave.coordinator.rounds.round_app import initial_weights
from fedweave.coordinator.rounds.secure_agg import SecAggSettings
from fedweave.errors import UserError
from fedweave.history import open_store
from fedweave.learning.data import load_site_data
from fedweave.learning.tasks import load_task
from fedweave.learning.training import TrainConfig
from fedweave.learning.weights import load_weights_npz
from fedweave.simulations.federated import run_federated_simulation

pytestmark = pytest.mark.slow


def run_recorded(sim: RunConfig, tmp_path: Path, name: str):
    """Run ``sim`` recorded; return (report rows, round dicts, site dicts, split dir)."""
    store = open_store(f"sqlite:///{tmp_path / (name + '.db')}")
    run_id = store.start_run("federated", sim.data.task, {}, sim.training.seed)
    split = tmp_path / f"split-{name}"
    rows = run_federated_simulation(
        sim, listeners=[HistoryRecorder(store, run_id, tmp_path / f"ckpt-{name}")], split_dir=split
    )
    rounds, sites = store.rounds(run_id), store.site_results(run_id)
    store.close()
    return rows, rounds, sites, split


def test_secagg_aggregate_equals_fedavg_within_quantization_error(tmp_path):
    common = {"clients": 3, "rounds": 1, "partition": "iid", "seed": 3}
    _, plain_rounds, _, _ = run_recorded(
        RunConfig.of(secure_agg=False, **common), tmp_path, "plain"
    )
    _, secure_rounds, _, split = run_recorded(
        RunConfig.of(secure_agg=True, **common), tmp_path, "secure"
    )
    plain = load_weights_npz(plain_rounds[0]["checkpoint_path"])
    secure = load_weights_npz(secure_rounds[0]["checkpoint_path"])
    # Each site's scaled weights (x num_examples / max_weight) are stochastically rounded to a
    # grid of step 2*clip/levels: at most one step of error per site, divided by the total
    # scaled weight when SecAgg+ turns the sum back into a mean.
    settings = SecAggSettings()
    examples = sum(len(np.load(split / f"site-{i}.npz")["y"]) for i in range(3))
    bound = 3 * settings.quantization_step() * settings.max_weight / examples + 1e-6
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(plain, secure))
    assert [a.dtype for a in secure] == [a.dtype for a in plain]
    assert 0 < worst <= bound, f"max difference {worst:.3g} vs bound {bound:.3g}"


def test_server_never_sees_a_site_plaintext(tmp_path, monkeypatch):
    """Capture every masked vector the coordinator reads; none resembles any site's update."""
    from fedweave.flower_patches import secagg_vectors
    from fedweave.flower_patches.secagg_stages import StagedSecAggPlusWorkflow

    captured: list[np.ndarray] = []
    carried: list[bool] = []  # whether each reply's vector travelled in an array record
    original = StagedSecAggPlusWorkflow.masked_vector

    def capture(self, reply):
        carried.append(secagg_vectors.MASKED_VECTOR_RECORD in reply.content.array_records)
        vector = original(self, reply)
        for index in range(vector.layers):
            layer = vector.layer(index)
            captured.append(layer.values(0, int(np.prod(layer.shape))))
        return vector

    monkeypatch.setattr(StagedSecAggPlusWorkflow, "masked_vector", capture)
    sim = RunConfig.of(clients=3, rounds=1, partition="iid", seed=5, secure_agg=True)
    split = tmp_path / "split"
    run_federated_simulation(sim, split_dir=split)
    task = load_task("digits")
    start = initial_weights(sim)
    plaintexts = []
    for index in range(3):
        client = TaskClient(
            task, load_site_data(split / f"site-{index}.npz", task), TrainConfig(), index
        )
        fit_config = {"round": 1, "seed": sim.training.seed, "local_epochs": 1}
        weights, _, _ = client.fit(start, fit_config)
        plaintexts.append(np.concatenate([w.ravel() for w in weights]))
    # each site sends its masked weight factor, then its whole model as one masked vector,
    # in an array record (issue 36), added into the sum from there (secagg_sum)
    assert carried == [True] * 3
    assert len(captured) == 3 * 2
    for site in range(3):
        masked = captured[2 * site + 1]
        assert masked.dtype.kind in "iu" and masked.max() > 2**31  # spread over the modulus
        for plain in plaintexts:
            assert masked.shape == plain.shape
            assert abs(np.corrcoef(masked.astype(np.float64), plain)[0, 1]) < 0.05


def test_a_site_crashing_in_the_masked_stage_does_not_stop_the_round(tmp_path):
    sim = RunConfig.of(
        task="fault_tasks:RaisingDigits", clients=5, rounds=2, partition="iid", secure_agg=True
    )
    rows, rounds, sites, _ = run_recorded(sim, tmp_path, "crash")
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(r["replied"] == 4 and r["failed"] == 1 for r in rows)
    failed = [s for s in sites if s["status"] == "failed"]
    assert len(failed) == 2 and all("injected fault" in (s["reason"] or "") for s in failed)
    assert len({s["site_id"] for s in failed}) == 1 and failed[0]["site_id"] != "unknown"
    assert rows[-1]["accuracy"] > 0.5


def test_a_plain_rounds_crash_is_recorded_against_the_site_that_crashed(tmp_path):
    """Flower hands the strategy a bare exception for an error reply; the run's grid noted it
    under the site that sent it (``site_outcomes.OutcomeGrid``), so the failure is recorded
    under that site's name, not paired with a silent site by position."""
    sim = RunConfig.of(
        task="fault_tasks:RaisingDigits", clients=4, rounds=2, partition="iid", secure_agg=False
    )
    rows, rounds, sites, split = run_recorded(sim, tmp_path, "plain-crash")
    assert all(r["replied"] == 3 and r["failed"] == 1 for r in rows)
    failed = [s for s in sites if s["status"] == "failed"]
    assert len(failed) == 2 and all("injected fault" in (s["reason"] or "") for s in failed)
    assert {s["site_id"] for s in failed} == {f"site-{bad_site_index(split)}"}, failed


@pytest.mark.parametrize(
    "task, secure, reason",
    [
        ("fault_tasks:NanDigits", True, "non-finite"),
        ("fault_tasks:WrongShapeDigits", True, "has shape"),
        ("fault_tasks:WrongDtypeDigits", False, "has dtype float64"),
        ("fault_tasks:NanDigits", False, "non-finite"),
    ],
)
def test_bad_updates_are_rejected_with_reasons_and_the_run_goes_on(tmp_path, task, secure, reason):
    sim = RunConfig.of(task=task, clients=4, rounds=2, partition="iid", secure_agg=secure)
    rows, rounds, sites, _ = run_recorded(sim, tmp_path, "bad")
    assert [r["round"] for r in rounds] == [1, 2]
    rejected = [s for s in sites if s["status"] == "rejected"]
    assert len(rejected) == 2, sites
    assert all(reason in s["reason"] for s in rejected)
    assert all(np.isfinite(r["accuracy"]) for r in rows) and rows[-1]["accuracy"] > 0.5


def test_krum_survives_a_noisy_site_and_fedavg_does_not(tmp_path):
    common = {
        "task": "fault_tasks:NoisyDigits",
        "clients": 5,
        "rounds": 3,
        "partition": "iid",
        "secure_agg": False,
        "eval_fraction": 0.0,  # a fixed training budget, scored centrally
        "evaluate_every": 0,
    }
    krum, _, _, _ = run_recorded(RunConfig.of(strategy="krum", **common), tmp_path, "krum")
    fedavg, _, _, split = run_recorded(
        RunConfig.of(strategy="fedavg", **common), tmp_path, "avg"
    )
    assert bad_site_index(split) in range(5)
    assert krum[-1]["accuracy"] > 0.7
    assert fedavg[-1]["accuracy"] < 0.4


def test_share_derivation_and_refusals():
    assert derive_shares(3) == (3, 2)
    assert derive_shares(5) == (5, 3)
    shares, threshold = derive_shares(10)
    assert shares == 7 and threshold == 4
    with pytest.raises(UserError, match="at least 3 sites"):
        derive_shares(2)
    with pytest.raises(UserError, match="only reveals"):
        check_settings(RunConfig.of(strategy="krum", secure_agg=True), "simulate")
