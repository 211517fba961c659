"""Differential privacy through Flower's wrappers and mods, chosen to fit SecAgg+.

- ``central``: Gaussian noise added by the coordinator to the aggregate. Without SecAgg+ the
  coordinator clips each update (``DifferentialPrivacyServerSideFixedClipping``); with
  SecAgg+ it cannot see them, so sites clip (``DifferentialPrivacyClientSideFixedClipping``
  + ``fixedclipping_mod``, applied by the site when asked).
- ``local``: every site clips and noises its own update (``LocalDpMod``), with the
  parameters the coordinator sends in each round's config.
"""

from __future__ import annotations

from fedweave.config.sections import PrivacySection
from fedweave.contract import LOCAL_DP_KEYS

LOCAL_DP_SENSITIVITY = 1.0
"""Local DP: L2 sensitivity of one clipped update (``LocalDpMod``'s parameter)."""


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
    values = (settings.clipping_norm, LOCAL_DP_SENSITIVITY, settings.dp_epsilon, settings.dp_delta)
    return dict(zip(LOCAL_DP_KEYS, values))
