"""Strategy choice by name: Flower's implementations behind fedweave's reporting layer."""

from __future__ import annotations

from typing import Any

from flwr.server import strategy as flwr_strategies

from fedweave.coordinator.rounds.reporting import ReportingStrategy
from fedweave.coordinator.rounds.stragglers import StragglerStrategy
from fedweave.errors import UserError

STRATEGIES: dict[str, tuple[type, dict[str, Any]]] = {
    "fedavg": (flwr_strategies.FedAvg, {}),
    "fedprox": (flwr_strategies.FedProx, {}),  # proximal_mu: the --proximal-mu setting
    "fedadam": (flwr_strategies.FedAdam, {"eta": 0.01, "eta_l": 0.1, "tau": 1e-3}),
    "fedyogi": (flwr_strategies.FedYogi, {"eta": 0.01, "eta_l": 0.1, "tau": 1e-3}),
    "fedmedian": (flwr_strategies.FedMedian, {}),
    "trimmedavg": (flwr_strategies.FedTrimmedAvg, {"beta": 0.2}),
    "krum": (flwr_strategies.Krum, {"num_malicious_clients": 1, "num_clients_to_keep": 0}),
    "multikrum": (flwr_strategies.Krum, {"num_malicious_clients": 1, "num_clients_to_keep": 3}),
}
"""name → (Flower strategy class, fedweave's defaults for its own knobs)."""

REPORTING_KWARGS = frozenset(
    {
        "evaluator", "listeners", "round_starts", "round_offset", "max_update_norm", "deadline",
        "min_replies", "evaluate_every", "last_round", "cross_site", "site_replies",
        "compression", "traffic", "equal_weights", "privacy_budget", "spooled",
    }
)  # fmt: skip
"""``make_strategy`` keywords meant for ``ReportingStrategy``; the rest go to Flower's strategy."""


def make_strategy(
    name: str, secure_agg: bool, stragglers: float = 0.0, seed: int = 0, **kwargs: Any
) -> ReportingStrategy:
    """Flower's ``name`` strategy, built with its own keyword arguments, wrapped for reporting.

    Parameters
    ----------
    name : str
        A key of ``STRATEGIES``: ``fedavg``, ``fedprox``, ``fedadam``, ``fedyogi``,
        ``fedmedian``, ``trimmedavg``, ``krum`` or ``multikrum``.
    secure_agg : bool
        Whether SecAgg+ aggregates the fit results (the options' rules refuse the robust
        strategies then: ``fedweave/config/rules.py``).
    stragglers : float (default: 0)
        Simulation: share of each round's sampled sites that straggle (``StragglerStrategy``
        around the Flower strategy; FedProx keeps their partial work, others drop them).
    seed : int (default: 0)
        The run's seed, which fixes the stragglers of each round.
    **kwargs : Any
        ``evaluator`` (required; ``None`` without central data), ``listeners``,
        ``round_starts``, ``round_offset``, ``max_update_norm``, ``deadline``, ``min_replies``,
        ``evaluate_every``, ``last_round``, ``cross_site``, ``site_replies``,
        ``compression``, ``traffic``, ``equal_weights``, ``privacy_budget`` and ``spooled`` go to
        ``ReportingStrategy`` (see there for their meaning and defaults); every other keyword
        (``fraction_fit``, ``min_fit_clients``, ``initial_parameters``, ``on_fit_config_fn``,
        ...) goes to the Flower strategy, beside fedweave's defaults for it in ``STRATEGIES``.

    Returns
    -------
    ReportingStrategy
        The reporting wrapper; the Flower strategy is its ``strategy`` attribute.
    """
    if name not in STRATEGIES:  # the option's choices refuse it first (sections.py)
        raise UserError(f"unknown strategy '{name}': use one of {', '.join(STRATEGIES)}")
    reporting_kwargs = {key: value for key, value in kwargs.items() if key in REPORTING_KWARGS}
    flower_kwargs = {key: value for key, value in kwargs.items() if key not in REPORTING_KWARGS}
    base, defaults = STRATEGIES[name]
    if name in ("krum", "multikrum"):
        per_round = flower_kwargs.get("min_fit_clients", 0)
        defaults = dict(defaults)
        defaults["num_clients_to_keep"] = min(
            defaults["num_clients_to_keep"], max(per_round - 2, 0)
        )
    inner = base(**{**defaults, **flower_kwargs})
    if stragglers > 0:
        inner = StragglerStrategy(
            inner, stragglers, seed, partial_work_counts=name == "fedprox",
            round_offset=reporting_kwargs.get("round_offset", 0),
        )  # fmt: skip
    return ReportingStrategy(inner, secure_agg=secure_agg, **reporting_kwargs)
