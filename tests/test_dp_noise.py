"""The DP noise as an adversary who knows everything the run records and sends would attack
it: the run's seed (sent with every round, stored in the history), the coordinator's stated
settings, the sites' replies. In-process, on the real release and floor code."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.strategy import FedAvg

from fedweave.client.local_dp import LocalLedger, local_noise
from fedweave.client.mods import floor_problem
from fedweave.config import RunConfig
from fedweave.contract import (
    DP_DELTA_KEY,
    DP_EPSILON_AFTER_KEY,
    DP_MODE_KEY,
    LOCAL_DP_KEYS,
    NODE_MAX_DELTA_KEY,
    NODE_MAX_EPSILON_KEY,
    NODE_REQUIRE_DP_KEY,
)
from fedweave.coordinator.rounds.privacy import (
    fixed_denominator_release,
    local_dp_config,
    wrap_for_central_dp,
)
from fedweave.learning.training import seed_everything
from fedweave.privacy.noise import SecureRandom, add_secure_noise
from fedweave.privacy_accounting import spent

SIZE = 20_000


def _model(value: float) -> list[np.ndarray]:
    return [np.full((SIZE // 4, 4), value, dtype=np.float32)]


def test_central_noise_is_not_the_seeded_stream_and_has_the_stated_size():
    """The attack of the review: seed NumPy as the run did (its seed is in the history), take
    the next block of N(0, z*C/m) and subtract it from the update: under today's noise nothing
    of it cancels (the residual has the noise's size twice over), and the noise has the std
    the header states."""
    std = 0.05
    clean = 0.5  # the global 0 moved by a mean of 0.5 from 4 of 4 sites
    for seed in (0, 1, 7):
        seed_everything(seed)
        released = fixed_denominator_release(_model(0.0), _model(clean), 4, 4, std)[0]
        noise = released.astype(np.float64).ravel() - clean
        assert abs(noise.std() - std) < 0.05 * std  # the stated size
        for stream in (np.random.RandomState(seed), np.random.default_rng(seed)):
            residual = noise - stream.normal(0.0, std, SIZE)
            assert residual.std() > 1.3 * std  # independent: sqrt(2) x std; the stream's: 0
    seed_everything(0)
    first = fixed_denominator_release(_model(0.0), _model(clean), 4, 4, std)[0]
    seed_everything(0)
    second = fixed_denominator_release(_model(0.0), _model(clean), 4, 4, std)[0]
    assert not np.array_equal(first, second)  # the same seed, two releases: fresh noise


def test_a_short_round_is_summed_over_the_planned_cohort():
    """Fixed denominator: 3 of 4 sites replied with a mean update of 0.4: the model moves by
    their sum over 4 (0.3), so one site more or less moves it by at most C/4."""
    released = fixed_denominator_release(_model(1.0), _model(1.4), 3, 4, 0.0)[0]
    assert np.allclose(released, 1.3)


def _fit_res(weights: list[np.ndarray]) -> FitRes:
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(weights), 1, {})


def test_the_coordinator_clips_each_update_and_divides_by_the_cohort():
    """Without SecAgg+ the coordinator clips each update to C and sums them over the planned
    cohort: an update scaled up a thousandfold by its site weighs no more than C / m."""
    config = RunConfig.of(dp="central", noise_multiplier=1e-9, clipping_norm=1.0)
    strategy = wrap_for_central_dp(FedAvg(), config.privacy, secure_agg=False, sampled=4)
    start = [np.zeros(4, dtype=np.float64)]
    strategy.configure_fit(1, ndarrays_to_parameters(start), _NoSites())
    honest = [np.array([0.1, 0.0, 0.0, 0.0])]
    scaled = [np.array([1000.0, 0.0, 0.0, 0.0])]
    results = [(None, _fit_res(honest)), (None, _fit_res(honest)), (None, _fit_res(scaled))]
    aggregated, _ = strategy.aggregate_fit(1, results, [])
    moved = parameters_to_ndarrays(aggregated)[0]
    assert math.isclose(moved[0], (0.1 + 0.1 + 1.0) / 4, rel_tol=1e-6)


class _NoSites:
    """A client manager with no sites: central DP's ``configure_fit`` asks nothing of it."""

    def num_available(self) -> int:
        return 0

    def sample(self, num_clients: int, min_num_clients: int | None = None, criterion=None):
        return []


def test_local_noise_is_fresh_and_sized_for_twice_the_clipping_norm():
    config = local_dp_config(RunConfig.of(dp="local", clipping_norm=2.0, dp_epsilon=4.0,
                                          dp_delta=1e-5).privacy)  # fmt: skip
    noise, problem = local_noise(config)
    assert problem is None
    assert noise.sensitivity == 4.0 == noise.stated_sensitivity
    assert math.isclose(noise.std, 4.0 * math.sqrt(2 * math.log(1.25 / 1e-5)) / 4.0)
    zeros = [np.zeros(SIZE, dtype=np.float32)]
    seed_everything(0)
    first = add_secure_noise(zeros, noise.std)[0]
    seed_everything(0)
    second = add_secure_noise(zeros, noise.std)[0]
    assert not np.array_equal(first, second)
    assert abs(first.std() - noise.std) < 0.05 * noise.std


def _local_round(**overrides: float) -> dict:
    config = dict(zip(LOCAL_DP_KEYS, (1.0, 2.0, 0.5, 1e-5)))
    config.update({DP_MODE_KEY: "local", DP_EPSILON_AFTER_KEY: 0.5, DP_DELTA_KEY: 1e-5})
    config.update(overrides)
    return config


FLOOR = {NODE_REQUIRE_DP_KEY: "local", NODE_MAX_EPSILON_KEY: "8.0"}


@pytest.mark.parametrize(
    "config, said",
    [
        (_local_round(**{LOCAL_DP_KEYS[1]: 0.0}), "states local DP sensitivity 0, below the 2"),
        (_local_round(**{LOCAL_DP_KEYS[2]: 0.0}), "asks for local DP with epsilon 0: no noise"),
        (_local_round(**{LOCAL_DP_KEYS[2]: math.inf}), "with epsilon inf: no noise"),
        (_local_round(**{LOCAL_DP_KEYS[0]: 0.0}), "clipping norm 0 bounds nothing"),
        ({k: v for k, v in _local_round().items() if k not in LOCAL_DP_KEYS},
         "asks for local DP without its settings: no noise"),
    ],
)
def test_a_site_refuses_a_local_round_that_asks_for_no_noise(config: dict, said: str):
    """The site's floor is its own computation: a coordinator stating epsilon 0.5 with
    sensitivity 0, or sending no local-DP keys at all, is refused before training."""
    problem = floor_problem(FLOOR, config, secure=False, run_id=1)
    assert problem is not None and said in problem


def test_the_site_budget_counts_its_own_noise_not_the_coordinators_word():
    """A coordinator that states epsilon 0.01 after the round while asking for epsilon 3 a
    round: the site composes its own releases and refuses the round that would cross 8."""
    ledger, rounds = LocalLedger(), 0
    config = _local_round(**{LOCAL_DP_KEYS[2]: 3.0, DP_EPSILON_AFTER_KEY: 0.01})
    noise, _ = local_noise(config)
    while floor_problem(FLOOR, config, False, 42, ledger) is None:
        ledger.record(42, noise.multiplier)
        rounds += 1
        assert rounds < 100
    problem = floor_problem(FLOOR, config, False, 42, ledger)
    assert "its own noise" in problem and "the coordinator states 0.010" in problem
    assert spent([(noise.multiplier, rounds)], 1e-5) <= 8.0
    assert spent([(noise.multiplier, rounds + 1)], 1e-5) > 8.0
    assert floor_problem(FLOOR, config, False, 43, ledger) is None  # another run


def test_a_site_caps_delta():
    problem = floor_problem({NODE_MAX_DELTA_KEY: "1e-06"}, _local_round(), False, 1)
    assert "at most delta 1e-06 (--max-delta), but the run asks for delta 1e-05" in problem
    assert floor_problem({NODE_MAX_DELTA_KEY: "1e-05"}, _local_round(), False, 1) is None


def test_secure_normals_are_standard():
    values = SecureRandom().normal(200_000, 1.0)
    assert abs(values.mean()) < 0.01 and abs(values.std() - 1.0) < 0.01
    assert abs(np.mean(np.abs(values) > 1.96) - 0.05) < 0.003
