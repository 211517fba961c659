"""One site's example count cannot make a round's mean its own (``site_weights.py``): in
FedAvg's aggregate, in the federated evaluation figures, and under SecAgg+ (refused before
the sum); an honest federation's weights stay as they were."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.strategy import FedAvg

from fedweave.coordinator.rounds.federated_evaluation import weighted_evaluation
from fedweave.coordinator.rounds.reporting import ReportingStrategy
from fedweave.coordinator.rounds.site_weights import (
    MAX_TIMES_MEDIAN,
    bounded_results,
    count_bound,
)


def _fit(value: float, count: float) -> FitRes:
    weights = [np.full((3, 2), value, np.float32), np.full(2, value, np.float32)]
    return FitRes(Status(Code.OK, "ok"), ndarrays_to_parameters(weights), count, {})


def test_the_bound_is_a_multiple_of_the_lower_median_of_positive_counts():
    assert count_bound([100, 300, 10**12]) == MAX_TIMES_MEDIAN * 300
    assert count_bound([100, 300, 10**12, 10**12]) == MAX_TIMES_MEDIAN * 300  # the lower one
    assert count_bound([0, 0, 40, 50, 60]) == MAX_TIMES_MEDIAN * 50  # zeros weigh nothing
    assert count_bound([100, 10**12]) == float("inf")  # either of two may be the liar
    assert count_bound([0, 0, 0, 50]) == count_bound([]) == float("inf")


def test_honest_sites_within_the_bound_keep_their_counts_and_raise_no_warning():
    results = [(SimpleNamespace(node_id=i), _fit(1.0, n)) for i, n in enumerate((90, 200, 350))]
    kept, notes = bounded_results(results)
    assert [res.num_examples for _, res in kept] == [90, 200, 350] and notes == []


def test_a_site_claiming_a_trillion_zero_weights_cannot_drag_fedavg_to_zero():
    """The insider of issue 39: four honest sites send all-ones weights over 100 examples
    each; a fifth sends zeros and claims 10**12 examples. Taken at its word, the mean is
    ~4e-10; bounded, it weighs in as two median sites: the mean is 2/3. The history still
    records what it claimed, and the round a warning naming it."""
    reporting = ReportingStrategy(FedAvg(), evaluator=None)
    reporting._global = parameters_to_ndarrays(_fit(0.0, 1).parameters)
    reporting._sampled = [1, 2, 3, 4, 5]
    results = [(SimpleNamespace(node_id=i), _fit(1.0, 100)) for i in (1, 2, 3, 4)]
    results.append((SimpleNamespace(node_id=5), _fit(0.0, 10**12)))
    parameters, _ = reporting.aggregate_fit(1, results, [])
    mean = parameters_to_ndarrays(parameters)
    assert all(np.allclose(array, 4 * 100 / (4 * 100 + MAX_TIMES_MEDIAN * 100)) for array in mean)
    recorded = {int(site.site_id): site for site in reporting._sites}
    assert recorded[5].status == "ok" and recorded[5].num_examples == 10**12
    assert reporting._warnings == [
        "site 5 claimed 1e+12 examples; weighed in as 200 (2 x the round's median site)"
    ]


def test_under_central_dp_every_update_weighs_the_same_whatever_its_count():
    """Issue 33: central DP's noise is sized for a mean of equals (the ledger assumes it), so
    with ``equal_weights`` a site claiming 10**12 examples weighs as much as one claiming 1;
    the history still records the counts claimed."""
    reporting = ReportingStrategy(FedAvg(), evaluator=None, equal_weights=True)
    reporting._global = parameters_to_ndarrays(_fit(0.0, 1).parameters)
    reporting._sampled = [1, 2, 3, 4]
    results = [(SimpleNamespace(node_id=i), _fit(1.0, 1)) for i in (1, 2, 3)]
    results.append((SimpleNamespace(node_id=4), _fit(0.0, 10**12)))
    parameters, _ = reporting.aggregate_fit(1, results, [])
    assert all(np.allclose(array, 3 / 4) for array in parameters_to_ndarrays(parameters))
    assert {int(s.site_id): s.num_examples for s in reporting._sites}[4] == 10**12


class _Evaluated:
    def __init__(self, loss: float, n: int, accuracy: float) -> None:
        self.loss, self.num_examples, self.metrics = loss, n, {"accuracy": accuracy}


def test_a_site_claiming_ten_million_perfect_evaluations_cannot_make_the_federated_figure():
    """Issue 39's evaluation insider: three honest sites at accuracy ~0.63 over ~100
    examples, one claiming 10**7 examples at accuracy 1.0 and loss 0.0001."""
    honest = [(None, _Evaluated(1.1, n, 0.63)) for n in (90, 100, 110)]
    figures = weighted_evaluation([*honest, (None, _Evaluated(0.0001, 10**7, 1.0))])
    bound = MAX_TIMES_MEDIAN * 100
    assert figures["accuracy"] == pytest.approx((0.63 * 300 + 1.0 * bound) / (300 + bound))
    assert figures["accuracy"] < 0.85  # taken at its word: 0.99998


@pytest.mark.slow
def test_a_simulated_insider_claiming_a_trillion_zero_weights_leaves_the_others_learning(
    tmp_path,
):
    """Issue 39's first row, replayed in a plain simulation: five digits sites, one of which
    (its own install rewritten: ``fault_tasks.MarkedDigits``) sends zero weights claiming
    10**12 examples every round. Taken at its word the model ended after 5
    rounds at chance, 0.10 (the same run without the insider: ~0.88); bounded, the others
    still learn (0.65), and each round records the claim and the weight it was given."""
    from fault_tasks import ZEROS_CLAIMING_MARK
    from insider_runs import run_with_insiders

    rounds, sites = run_with_insiders(
        tmp_path, {4: ZEROS_CLAIMING_MARK}, ["--rounds", "5", "--no-secure-agg"]
    )
    assert rounds[-1]["eval_accuracy"] >= 0.5, [r["eval_accuracy"] for r in rounds]
    claimed = [s for s in sites if s["num_examples"] == 10**12]
    assert [s["round"] for s in claimed] == [1, 2, 3, 4, 5]
    assert all(s["status"] == "ok" for s in claimed)  # taken part, only not at its word
    for summary in rounds:
        notes = [w for w in summary["extra"]["warnings"] if "claimed 1e+12 examples" in w]
        assert len(notes) == 1 and "2 x the round's median site" in notes[0], summary["extra"]
