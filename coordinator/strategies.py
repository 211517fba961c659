"""Strategy choice by name: Flower's implementations behind fedweave's reporting layer."""

from __future__ import annotations

from typing import Any

from flwr.server import strategy as flwr_strategies

from fedweave.coordinator.reporting import ReportingMixin
from fedweave.errors import UserError

STRATEGIES: dict[str, tuple[type, dict[str, Any]]] = {
    "fedavg": (flwr_strategies.FedAvg, {}),
    "fedprox": (flwr_strategies.FedProx, {"proximal_mu": 0.01}),
    "fedadam": (flwr_strategies.FedAdam, {"eta": 0.01, "eta_l": 0.1, "tau": 1e-3}),
    "fedyogi": (flwr_strategies.FedYogi, {"eta": 0.01, "eta_l": 0.1, "tau": 1e-3}),
    "fedmedian": (flwr_strategies.FedMedian, {}),
    "trimmedavg": (flwr_strategies.FedTrimmedAvg, {"beta": 0.2}),
    "krum": (flwr_strategies.Krum, {"num_malicious_clients": 1, "num_clients_to_keep": 0}),
    "multikrum": (flwr_strategies.Krum, {"num_malicious_clients": 1, "num_clients_to_keep": 3}),
}
"""name → (Flower strategy class, fedweave's defaults for its own knobs)."""

ROBUST_STRATEGIES = frozenset({"fedmedian", "trimmedavg", "krum", "multikrum"})
"""These look at each site's update, which SecAgg+ exists to hide."""


def check_strategy_choice(name: str, secure_agg: bool) -> None:
    """Refuse unknown names and combinations that cannot work, with the reason."""
    if name not in STRATEGIES:
        raise UserError(f"unknown strategy '{name}': use one of {', '.join(STRATEGIES)}")
    if secure_agg and name in ROBUST_STRATEGIES:
        raise UserError(
            f"--strategy {name} compares individual site updates, but SecAgg+ only reveals "
            "their sum; use --no-secure-agg for robust aggregation, or fedavg/fedprox/fedadam/"
            "fedyogi with SecAgg+"
        )


def make_strategy(name: str, secure_agg: bool, **kwargs: Any) -> ReportingMixin:
    """A reporting strategy wrapping Flower's ``name`` strategy.

    ``kwargs`` are the reporting layer's (evaluator, listeners, round_offset,
    max_update_norm) and the Flower strategy's (fraction_fit, min_fit_clients,
    initial_parameters, on_fit_config_fn, ...).
    """
    check_strategy_choice(name, secure_agg)
    base, defaults = STRATEGIES[name]
    if name in ("krum", "multikrum"):
        per_round = kwargs.get("min_fit_clients", 0)
        defaults = dict(defaults)
        defaults["num_clients_to_keep"] = min(
            defaults["num_clients_to_keep"], max(per_round - 2, 0)
        )
    cls = type(f"Reporting{base.__name__}", (ReportingMixin, base), {})
    return cls(secure_agg=secure_agg, **defaults, **kwargs)
