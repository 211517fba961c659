"""Strategies by name and Flower's DP wrappers/mods, on real Flower simulations."""

import pytest

from fedweave.config import RunConfig
from fedweave.simulations.federated import run_federated_simulation

pytestmark = pytest.mark.slow


def final_accuracy(**kwargs) -> float:
    # a fixed training budget, scored centrally: every site trains on all of its data
    args = {"clients": 3, "rounds": 2, "partition": "iid", "seed": 1, "eval_fraction": 0.0,
            "evaluate_every": 0} | kwargs  # fmt: skip
    return run_federated_simulation(RunConfig.of(**args))[-1]["accuracy"]


def test_fedprox_learns_with_secure_aggregation():
    assert final_accuracy(strategy="fedprox", secure_agg=True) > 0.8


def test_central_dp_clipping_is_applied_at_the_sites_under_secagg():
    """A clipping norm of 1e-4 freezes the model; the same run without DP learns."""
    assert final_accuracy(dp="central", clipping_norm=1e-4, noise_multiplier=0.01) < 0.3
