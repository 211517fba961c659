"""A seeded federated run repeats exactly: the aggregate does not depend on which site
answered first, and SecAgg+'s stochastic rounding is a function of the update."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.server.strategy.aggregate import aggregate_inplace

from fedweave.contract import SITE_NAME_METRIC
from fedweave.coordinator.rounds.reporting import arrival_independent_order
from fedweave.flower_patches.secagg_masks import quantize_flat


def fit_result(weights: list[np.ndarray], examples: int, name: str | None) -> tuple[None, FitRes]:
    status = Status(code=Code.OK, message="")
    metrics = {} if name is None else {SITE_NAME_METRIC: name}
    return None, FitRes(status, ndarrays_to_parameters(weights), examples, metrics)


@pytest.mark.parametrize(
    "names", [("a", "b", "c", "d"), (None,) * 4, ("a", "a", "c", "d")],
    ids=["by-name", "by-digest", "names-repeat"],
)
def test_fedavg_of_reordered_results_is_bit_identical_after_sorting(names):
    rng = np.random.default_rng(0)
    results = [
        fit_result([rng.normal(size=(64, 32)).astype(np.float32)], examples, name)
        for examples, name in zip((97, 131, 180, 55), names)
    ]
    raw, sorted_ = set(), set()
    for order in itertools.permutations(results):
        raw.add(aggregate_inplace(list(order))[0].tobytes())
        sorted_.add(aggregate_inplace(arrival_independent_order(list(order)))[0].tobytes())
    assert len(raw) > 1, "float addition order should matter for this input"
    assert len(sorted_) == 1


def test_stochastic_rounding_repeats_for_the_same_update_and_stays_unbiased():
    clip, levels = 8.0, 2**22
    step = 2 * clip / levels
    update = [np.full(200_000, -clip + 0.25 * step), np.zeros(3)]
    first, again = quantize_flat(update, clip, levels), quantize_flat(update, clip, levels)
    assert np.array_equal(first[0], again[0])
    rounded_up = float(np.mean(first[0][:200_000]))  # each value is 0.25 steps above 0
    assert abs(rounded_up - 0.25) < 0.005
    other = quantize_flat([update[0], np.ones(3) * 1e-9], clip, levels)
    assert not np.array_equal(first[0][:200_000], other[0][:200_000])
