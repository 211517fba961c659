"""Differential privacy through Flower's wrappers and mods, chosen to fit SecAgg+.

- ``central``: Gaussian noise added by the coordinator to the aggregate. Without SecAgg+ the
  coordinator clips each update (``DifferentialPrivacyServerSideFixedClipping``); with
  SecAgg+ it cannot see them, so sites clip (``DifferentialPrivacyClientSideFixedClipping``
  + ``fixedclipping_mod``, applied by the site when asked).
- ``local``: every site clips and noises its own update (``LocalDpMod``), with the
  parameters the coordinator sends in each round's config.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedweave.contract import LOCAL_DP_KEYS
from fedweave.errors import UserError

DP_MODES = ("none", "central", "local")


@dataclass(frozen=True)
class DpSettings:
    """Differential privacy choice.

    Attributes:
        mode: ``none`` (default), ``central`` or ``local``.
        noise_multiplier: Gaussian noise std / clipping norm (central; default 1.0).
        clipping_norm: L2 bound on each update (default 1.0).
        epsilon / delta / sensitivity: local DP budget per round (defaults 10, 1e-5, 1.0).
    """

    mode: str = "none"
    noise_multiplier: float = 1.0
    clipping_norm: float = 1.0
    epsilon: float = 10.0
    delta: float = 1e-5
    sensitivity: float = 1.0

    def check(self) -> None:
        if self.mode not in DP_MODES:
            raise UserError(f"unknown --dp '{self.mode}': use one of {', '.join(DP_MODES)}")
        if self.mode != "none" and not self.clipping_norm > 0:
            raise UserError("--clipping-norm must be > 0 for differential privacy")
        if self.noise_multiplier < 0:
            raise UserError("--noise-multiplier must be >= 0")


def wrap_for_central_dp(strategy, settings: DpSettings, secure_agg: bool, sampled: int):
    """``strategy`` with central DP around it (or unchanged when mode is not central)."""
    if settings.mode != "central":
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


def local_dp_config(settings: DpSettings) -> dict[str, float]:
    """Fit-config entries that switch on ``LocalDpMod`` at the sites."""
    if settings.mode != "local":
        return {}
    values = (settings.clipping_norm, settings.sensitivity, settings.epsilon, settings.delta)
    return dict(zip(LOCAL_DP_KEYS, values))
