"""Differential privacy, chosen to fit SecAgg+, with noise no one but its adder can rebuild.

- ``central``: the coordinator adds Gaussian noise to the aggregate (``CentralDp``). Without
  SecAgg+ it clips each update; with SecAgg+ it cannot see them, so sites clip (Flower's
  ``fixedclipping_mod``, applied by the site when asked). The mean has a fixed denominator,
  the planned cohort ``m`` (DP-FedAvg, McMahan et al.): the clipped updates that arrived are
  summed and divided by ``m`` whoever replied, so adding or removing one site moves the
  aggregate by at most ``C / m``, the sensitivity the noise ``z * C / m`` is sized for, in
  every round, full or short.
- ``local``: every site clips its update to ``C`` and noises it itself
  (``client/local_dp.py``); any two inputs of a site are neighbours, sensitivity ``2C``.
- ``sample``: every site trains with DP-SGD (Opacus: each example's gradient clipped, noise
  on every step) and keeps its own ledger (``fedweave/learning/sample_dp.py``).

All noise is drawn from a fresh secret key (``fedweave/privacy/noise.py``), never from the
run's seed. Under central DP every site weighs in equally: without SecAgg+ the coordinator
weighs them so (``ReportingStrategy``'s ``equal_weights``), with it SecAgg+'s ``max_weight``
is 1 (``equal_site_weights``). What the rounds spend together: ``privacy_ledger.py``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from fedweave.config.sections import PrivacySection
from fedweave.contract import LOCAL_DP_KEYS, SAMPLE_DP_KEYS

log = logging.getLogger(__name__)


def wrap_for_central_dp(strategy, settings: PrivacySection, secure_agg: bool, sampled: int):
    """``strategy`` with central DP around it (or unchanged when ``--dp`` is not central).

    Args:
        strategy: the run's ``ReportingStrategy`` (its ``in_mean`` counts each round's mean).
        settings: the run's privacy settings.
        secure_agg: sites clip (SecAgg+ hides single updates from the coordinator).
        sampled: the planned cohort ``m``, the fixed denominator.
    """
    if settings.dp != "central":
        return strategy
    from flwr.server.strategy import (
        DifferentialPrivacyClientSideFixedClipping,
        DifferentialPrivacyServerSideFixedClipping,
    )

    flower = (
        DifferentialPrivacyClientSideFixedClipping
        if secure_agg
        else DifferentialPrivacyServerSideFixedClipping
    )
    wrapper = type("CentralDp", (CentralDp, flower), {"clips_here": not secure_agg})
    return wrapper(strategy, settings.noise_multiplier, settings.clipping_norm, sampled)


def fixed_denominator_release(
    global_weights: list[np.ndarray],
    mean: list[np.ndarray],
    in_mean: int,
    cohort: int,
    std: float,
) -> list[np.ndarray]:
    """The global model moved by the sum of ``in_mean`` clipped updates over ``cohort`` (their
    ``mean`` rescaled by ``in_mean / cohort``), plus N(0, std²) noise from a fresh secret key
    on every floating tensor; other tensors (counters) are the mean's."""
    from fedweave.privacy.noise import SecureRandom

    source, scale = SecureRandom(), in_mean / cohort
    released = []
    for g, a in zip(global_weights, mean, strict=True):
        if not np.issubdtype(a.dtype, np.floating):
            released.append(a)
            continue
        moved = g.astype(np.float64) + (a.astype(np.float64) - g) * scale
        moved += source.normal(int(a.size), std).reshape(a.shape)
        released.append(moved.astype(a.dtype))
    return released


class CentralDp:
    """Flower's central-DP wrappers' clipping with our release: a fixed denominator (the
    planned cohort) and noise from a secret source (``fixed_denominator_release``), mixed in
    before Flower's ``DifferentialPrivacy*FixedClipping`` (``wrap_for_central_dp``).

    A failed site's reply is recorded by the wrapped ``ReportingStrategy`` like any other
    round's, and the round still releases what arrived: with a fixed denominator a short round
    is the same mechanism as a full one."""

    clips_here: bool
    strategy: Any
    noise_multiplier: float
    clipping_norm: float
    num_sampled_clients: int

    def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
        from flwr.common import parameters_to_ndarrays

        self._global_weights = parameters_to_ndarrays(parameters)
        return super().configure_fit(server_round, parameters, client_manager)  # type: ignore[misc]

    def aggregate_fit(self, server_round: int, results: list, failures: list) -> tuple:
        from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

        if self.clips_here:  # no SecAgg+: the coordinator sees, and clips, each update
            from fedweave.privacy.clipping import clipped

            for _, res in results:
                weights = parameters_to_ndarrays(res.parameters)
                weights = clipped(weights, self._global_weights, self.clipping_norm)
                res.parameters = ndarrays_to_parameters(weights)
        aggregated, metrics = self.strategy.aggregate_fit(server_round, results, failures)
        in_mean = int(getattr(self.strategy, "in_mean", len(results)))
        if aggregated is None or in_mean < 1:
            return aggregated, metrics
        cohort = self.num_sampled_clients
        released = fixed_denominator_release(
            self._global_weights, parameters_to_ndarrays(aggregated), min(in_mean, cohort),
            cohort, central_noise_std(self.noise_multiplier, self.clipping_norm, cohort),
        )  # fmt: skip
        log.info(
            "round %s: central DP noise of std %.4g added to the sum of %d clipped updates "
            "over %d (fresh secret noise)", server_round, central_noise_std(
                self.noise_multiplier, self.clipping_norm, cohort), in_mean, cohort,
        )  # fmt: skip
        return ndarrays_to_parameters(released), metrics


def central_noise_std(noise_multiplier: float, clipping_norm: float, cohort: int) -> float:
    """Central DP's noise std: ``z * C / m`` for sensitivity ``C / m`` (fixed denominator)."""
    return noise_multiplier * clipping_norm / cohort


def local_dp_config(settings: PrivacySection) -> dict[str, float]:
    """Fit-config entries that switch on ``LocalDpMod`` at the sites."""
    if settings.dp != "local":
        return {}
    # any two clipped updates of a site are at most 2C apart: the sensitivity each site
    # sizes its own noise for (client/local_dp.py), stated here for it to check
    values = (
        settings.clipping_norm, 2 * settings.clipping_norm, settings.dp_epsilon, settings.dp_delta
    )
    return dict(zip(LOCAL_DP_KEYS, values))


def sample_dp_config(settings: PrivacySection) -> dict[str, float]:
    """Fit-config entries that switch on DP-SGD at the sites (``--dp sample``)."""
    if settings.dp != "sample":
        return {}
    values = (settings.noise_multiplier, settings.clipping_norm, settings.dp_delta)
    return dict(zip(SAMPLE_DP_KEYS, values))
