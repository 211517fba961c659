"""The privacy arithmetic the options' rules, the run header and the coordinator's ledger
share: what noise multiplier one round of each ``--dp`` mechanism releases with, what planned
rounds spend, and the noise a ``--target-epsilon`` asks for.

Every figure comes from Flower's ``RdpAccountant`` (``flwr.serverapp``, on Google's
``dp-accounting``) composing Gaussian releases without amplification by sampling, with one
site as the unit and add-or-remove-one as the relation (``coordinator/rounds/
privacy_ledger.py`` says why); the calibration is ``dp-accounting``'s own
``calibrate_dp_mechanism``.
"""

from __future__ import annotations

import math
from typing import Any

ACCOUNTANT = "rdp (Flower's RdpAccountant on dp-accounting)"
"""The accountant every ledger record names."""
CALIBRATION_DIGITS = 4
"""A calibrated noise multiplier is rounded up to this many significant digits, so the run
header and the stored settings show a number a person can repeat (and it still spends no
more than the target)."""


def local_noise_multiplier(epsilon: float, delta: float) -> float:
    """Noise std over the clipping norm that Flower's ``LocalDpMod`` adds for ``epsilon`` and
    ``delta`` (the classic Gaussian mechanism's sizing; it holds only for epsilon below 1)."""
    return math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def local_epsilon_for(multiplier: float, delta: float) -> float:
    """The ``--dp-epsilon`` that makes ``LocalDpMod`` add noise of ``multiplier``."""
    return math.sqrt(2 * math.log(1.25 / delta)) / multiplier


def round_multiplier(privacy: Any) -> float:
    """The noise multiplier of one round in which every sampled site took part, under the
    run's privacy settings (``PrivacySection``; ``--dp`` central or local)."""
    if privacy.dp == "central":
        return privacy.noise_multiplier
    if privacy.dp == "local":
        return local_noise_multiplier(privacy.dp_epsilon, privacy.dp_delta)
    raise ValueError(f"--dp {privacy.dp} has no per-round release at the coordinator")


def accountant(delta: float, sites: int):
    """A fresh ledger accountant at ``delta`` for rounds of ``sites`` sites."""
    from flwr.serverapp import NeighboringRelation, PrivacyConfig, RdpAccountant, SamplingMethod

    return RdpAccountant(
        PrivacyConfig(
            target_delta=delta,
            population_size=max(sites, 1),
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            sampling_method=SamplingMethod.NO_AMPLIFICATION,
        )
    )


def compose(ledger, sites: int, multiplier: float, count: int = 1) -> None:
    """Compose ``count`` Gaussian releases of ``multiplier`` into ``ledger``."""
    from flwr.serverapp import GaussianPrivacyEvent

    population = ledger.config.population_size
    ledger.compose(GaussianPrivacyEvent(multiplier, min(sites, population), population), count)


def spent(releases: list[tuple[float, int]], delta: float) -> float:
    """Epsilon at ``delta`` after the ``(noise multiplier, rounds)`` runs in ``releases``."""
    if not releases:
        return 0.0
    ledger = accountant(delta, 1)
    for multiplier, count in releases:
        compose(ledger, 1, multiplier, count)
    return ledger.get_privacy_spent().epsilon


def calibrated_multiplier(target_epsilon: float, delta: float, rounds: int) -> float:
    """The smallest noise multiplier (to ``CALIBRATION_DIGITS``, rounded up) whose ``rounds``
    releases spend at most ``target_epsilon`` at ``delta``."""
    import dp_accounting

    def event(multiplier: float):
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(multiplier), rounds)

    found = dp_accounting.calibrate_dp_mechanism(
        dp_accounting.rdp.RdpAccountant, event, target_epsilon, delta
    )
    scale = 10 ** (math.floor(math.log10(found)) - CALIBRATION_DIGITS + 1)
    multiplier = math.ceil(found / scale) * scale
    while spent([(multiplier, rounds)], delta) > target_epsilon:  # tolerance on the wrong side
        multiplier += scale
    return float(f"{multiplier:.{CALIBRATION_DIGITS}g}")


def planned(privacy: Any, rounds: int) -> dict[str, float]:
    """The settings ``--target-epsilon`` stands for over ``rounds`` rounds: ``{"noise_multiplier":
    ...}`` (central) or ``{"dp_epsilon": ...}`` (local); ``{}`` without a target or DP."""
    if privacy.dp not in ("central", "local") or privacy.target_epsilon is None:
        return {}
    multiplier = calibrated_multiplier(privacy.target_epsilon, privacy.dp_delta, rounds)
    if privacy.dp == "central":
        return {"noise_multiplier": multiplier}
    epsilon = local_epsilon_for(multiplier, privacy.dp_delta)
    scale = 10 ** (math.floor(math.log10(epsilon)) - 5)
    return {"dp_epsilon": math.floor(epsilon / scale) * scale}  # down: never less noise


def with_planned_noise(config: Any) -> Any:
    """``config`` (a ``RunConfig``) with its ``--target-epsilon`` turned into the noise it
    stands for over ``--rounds`` (``planned``): what the run records and runs with. The same
    target always gives the same noise, so a resumed run keeps it."""
    return config.replace(**planned(config.privacy, config.training.rounds))
