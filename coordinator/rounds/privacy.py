"""Differential privacy through Flower's wrappers and mods, chosen to fit SecAgg+.

- ``central``: Gaussian noise added by the coordinator to the aggregate. Without SecAgg+ the
  coordinator clips each update (``DifferentialPrivacyServerSideFixedClipping``); with
  SecAgg+ it cannot see them, so sites clip (``DifferentialPrivacyClientSideFixedClipping``
  + ``fixedclipping_mod``, applied by the site when asked).
- ``local``: every site clips and noises its own update (``LocalDpMod``), with the
  parameters the coordinator sends in each round's config.
- ``sample``: every site trains with DP-SGD (Opacus: each example's gradient clipped, noise
  on every step) and keeps its own ledger (``fedweave/learning/sample_dp.py``).

Under central DP every site weighs in equally (the noise is sized for a mean of ``cohort``
clipped updates): without SecAgg+ the coordinator weighs them so (``ReportingStrategy``'s
``equal_weights``), with it SecAgg+'s ``max_weight`` is 1 (``equal_site_weights``), so each
site scales its masked vector by 1 and a higher count is refused before the sum. What the
rounds spend together: ``privacy_ledger.py``.
"""

from __future__ import annotations

from fedweave.config.sections import PrivacySection
from fedweave.contract import LOCAL_DP_KEYS, SAMPLE_DP_KEYS


def wrap_for_central_dp(strategy, settings: PrivacySection, secure_agg: bool, sampled: int):
    """``strategy`` with central DP around it (or unchanged when ``--dp`` is not central)."""
    if settings.dp != "central":
        return strategy
    from flwr.server.strategy import (
        DifferentialPrivacyClientSideFixedClipping,
        DifferentialPrivacyServerSideFixedClipping,
    )

    wrapper = (
        DifferentialPrivacyClientSideFixedClipping
        if secure_agg
        else DifferentialPrivacyServerSideFixedClipping
    )
    return wrapper(strategy, settings.noise_multiplier, settings.clipping_norm, sampled)


def local_dp_config(settings: PrivacySection) -> dict[str, float]:
    """Fit-config entries that switch on ``LocalDpMod`` at the sites."""
    if settings.dp != "local":
        return {}
    # the clipped update moves at most the clipping norm: that is its sensitivity (Flower's
    # mod takes the two apart; with a fixed 1, a norm of 5 got a fifth of its noise)
    values = (
        settings.clipping_norm, settings.clipping_norm, settings.dp_epsilon, settings.dp_delta
    )
    return dict(zip(LOCAL_DP_KEYS, values))


def sample_dp_config(settings: PrivacySection) -> dict[str, float]:
    """Fit-config entries that switch on DP-SGD at the sites (``--dp sample``)."""
    if settings.dp != "sample":
        return {}
    values = (settings.noise_multiplier, settings.clipping_norm, settings.dp_delta)
    return dict(zip(SAMPLE_DP_KEYS, values))
