"""Local differential privacy at a site (``--dp local``), decided and noised by the site itself.

The coordinator's round config asks for a clipping norm ``C``, an epsilon per round and a
delta (``LOCAL_DP_KEYS``); it also states a sensitivity, which the site never uses to size
its noise and refuses where it is below ``2C`` (a coordinator that understates it would
report an epsilon the noise does not give).
The site's own mechanism: its update is clipped to ``C``, so any two of its inputs give
updates at most ``2C`` apart (the replace-one relation: sensitivity ``2C``), and it adds
Gaussian noise of std ``2C * z`` with ``z = sqrt(2 ln(1.25 / delta)) / epsilon``, drawn from a
fresh secret key (``fedweave/privacy/noise.py``). Its own ledger (``LocalLedger``, per run)
composes one Gaussian release of multiplier ``z`` per round it took part in, and its floor
(``--max-epsilon``) is checked against that, never against the coordinator's stated figure.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from flwr.app import Context, Message, MessageType

from fedweave.contract import LOCAL_DP_KEYS
from fedweave.flower_patches import message_records as compat
from fedweave.flower_patches.message_records import ClientAppCallable


@dataclass(frozen=True)
class LocalNoise:
    """The noise this site adds for one round, as the site computes it.

    Attributes:
        clipping_norm: ``C``, the L2 bound of the site's update.
        multiplier: ``z``, noise std over the sensitivity ``2C``.
        delta: the delta the round's epsilon is stated at.
        stated_sensitivity: what the coordinator's config said (reported, not used).
    """

    clipping_norm: float
    multiplier: float
    delta: float
    stated_sensitivity: float

    @property
    def sensitivity(self) -> float:
        return 2 * self.clipping_norm

    @property
    def std(self) -> float:
        return self.multiplier * self.sensitivity


def local_noise(config: dict) -> tuple[LocalNoise | None, str | None]:
    """The noise a ``--dp local`` round's ``config`` makes this site add, or why the site
    refuses it (a round that asks for no noise, or for noise that is not a number):
    ``(None, None)`` where the round is not a local-DP one."""
    if not any(key in config for key in LOCAL_DP_KEYS):
        return None, None
    try:
        clipping_norm, sensitivity, epsilon, delta = (float(config[k]) for k in LOCAL_DP_KEYS)
    except (KeyError, TypeError, ValueError):
        return None, "the round's local DP settings are incomplete or not numbers"
    if not (math.isfinite(clipping_norm) and clipping_norm > 0):
        return None, f"the round's local DP clipping norm {clipping_norm:g} bounds nothing"
    if not (math.isfinite(epsilon) and epsilon > 0):
        return None, f"the round asks for local DP with epsilon {epsilon:g}: no noise"
    if not 0 < delta < 1:
        return None, f"the round's local DP delta {delta:g} is not between 0 and 1"
    if not sensitivity >= 2 * clipping_norm:
        return None, (
            f"the round states local DP sensitivity {sensitivity:g}, below the "
            f"{2 * clipping_norm:g} (2 x clipping norm {clipping_norm:g}) that bounds any two "
            "of this site's updates: its epsilon would be understated"
        )
    multiplier = math.sqrt(2 * math.log(1.25 / delta)) / epsilon
    return LocalNoise(clipping_norm, multiplier, delta, sensitivity), None


class LocalLedger:
    """What this site's noised updates have spent in each run (in this process): the noise
    multipliers of the rounds it took part in, composed by the RDP accountant."""

    def __init__(self) -> None:
        self._releases: dict[int, list[float]] = {}
        self._lock = threading.Lock()

    def epsilon(self, run_id: int, delta: float, more: float | None = None) -> float:
        """Epsilon at ``delta`` of run ``run_id``'s releases at this site (and ``more``)."""
        from fedweave.privacy_accounting import spent

        with self._lock:
            releases = [*self._releases.get(run_id, []), *([more] if more else [])]
        return spent([(z, 1) for z in releases], delta)

    def record(self, run_id: int, multiplier: float) -> None:
        with self._lock:
            self._releases.setdefault(run_id, []).append(multiplier)


LEDGER = LocalLedger()
"""This site process's local-DP ledger (the floor reads it, the mod writes it)."""


def local_dp_when_asked(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Clip this site's update to the round's ``C`` and add the site's own noise
    (``local_noise``) from a fresh secret key; the release goes into ``LEDGER``. A round whose
    settings the site refuses never reaches here (``privacy_floor`` refuses it first)."""
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    record = msg.content.config_records.get("fitins.config")
    noise, problem = local_noise(dict(record) if record is not None else {})
    if noise is None and problem is None:
        return call_next(msg, context)
    if noise is None:
        from fedweave.contract import SiteRefusal

        raise SiteRefusal(f"{problem}; this site adds local DP noise only as it computes it")
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

    from fedweave.privacy.clipping import clipped
    from fedweave.privacy.noise import add_secure_noise

    fit_ins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    reference = parameters_to_ndarrays(fit_ins.parameters)
    reply = call_next(msg, context)
    if reply.has_error() or not reply.content.array_records:
        return reply
    fit_res = compat.recorddict_to_fitres(reply.content, keep_input=True)
    weights = clipped(parameters_to_ndarrays(fit_res.parameters), reference, noise.clipping_norm)
    fit_res.parameters = ndarrays_to_parameters(add_secure_noise(weights, noise.std))
    reply.content = compat.fitres_to_recorddict(fit_res, keep_input=True)
    LEDGER.record(msg.metadata.run_id, noise.multiplier)
    return reply
