"""The privacy ledger: what a DP run's rounds have spent together, after each round.

A wrapper around the round listeners (as ``model_health.py`` is): after every round it
composes the round's release into Flower's ``RdpAccountant`` (``flwr.serverapp``, on Google's
``dp-accounting``) and puts the cumulative (epsilon, delta) on the round's summary
(``RoundSummary.privacy``), which the console line, the history and the report show. What
the accountant composed goes with every recorded round, so a resumed run
continues the ledger from what was recorded, never from zero (``recorded`` below; its noise
multipliers and round counts are the whole state: the ledger composes them again).

What each mechanism composes (``privacy.py`` sets the noise), with its neighbouring relation
and the sensitivity the noise is sized for:

- ``central``: one Gaussian release per round that aggregated, of noise multiplier
  ``noise_multiplier``. Relation: one site added or removed. The coordinator sums the clipped
  updates that arrived and divides by the planned cohort ``m`` (a fixed denominator), so one
  site moves the aggregate by at most ``C / m``, and the noise has std
  ``noise_multiplier * C / m``: a short round (fewer replies) is the same mechanism, its
  aggregate only smaller.
- ``local``: each site clips its update to ``C`` and adds noise of std
  ``2C * sqrt(2 ln(1.25 / delta)) / epsilon`` itself (``client/local_dp.py``). Relation: any
  two inputs of one site (replace-one), sensitivity ``2C``; the ledger composes a Gaussian
  release of multiplier ``sqrt(2 ln(1.25 / delta)) / epsilon`` per round in which sites were
  sampled: an upper bound for every site (one that sat a round out spent less).

No amplification by sampling is claimed: a round's sites are a fixed-size draw from those
connected at the time, not the Poisson or fixed-population sampling the bounds assume. Site
evaluation metrics and the federated statistics of a tabular task are not released through
the mechanism and are not in the ledger (docs/privacy.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fedweave.config.sections import PrivacySection
from fedweave.contract import (
    DP_DELTA_KEY,
    DP_EPSILON_AFTER_KEY,
    DP_MODE_KEY,
    SAMPLE_DP_EPSILON_METRIC,
)
from fedweave.errors import UserError
from fedweave.privacy.statement import (
    ACCOUNTANTS,
    NOISE_SOURCE,
    RELATIONS,
    SENSITIVITY,
)
from fedweave.privacy_accounting import accountant, compose, round_multiplier


def round_noise_multiplier(settings: PrivacySection, cohort: int, summary: Any) -> float | None:
    """The noise multiplier of ``summary``'s round's release, or ``None``: the round released
    nothing (no site's update reached the mean: it failed, or none replied)."""
    if settings.dp == "central":
        if summary.failed is not None or summary.replied == 0:
            return None
        return settings.noise_multiplier  # a fixed denominator: short rounds are alike
    if settings.dp == "local":
        return round_multiplier(settings) if summary.sites else None
    return None


def ledger_facts(settings: PrivacySection) -> dict[str, Any]:
    """What the run header and report say about the ledger (empty without DP)."""
    if settings.dp == "none":
        return {}
    if settings.dp == "sample":
        return {
            "accountant": ACCOUNTANTS["sample"],
            "unit": "example",
            "neighbouring": RELATIONS["sample"],
            "sensitivity": SENSITIVITY["sample"],
            "noise": NOISE_SOURCE,
            "sampling_amplification": "Poisson sampling of each batch (Opacus)",
            "delta": settings.dp_delta,
        }
    return {
        "accountant": ACCOUNTANTS[settings.dp],
        "unit": "site",
        "neighbouring": RELATIONS[settings.dp],
        "sensitivity": SENSITIVITY[settings.dp],
        "noise": NOISE_SOURCE,
        "sampling_amplification": "not claimed",
        "delta": settings.dp_delta,
    }


class BudgetSpent(Exception):
    """The next round would take the ledger past ``--max-epsilon``: the run ends here, as
    completed, with this as its reason (``round_app``'s ServerApp catches it)."""


class PrivacyLedger:
    """Round listeners whose summaries carry the run's cumulative privacy spend.

    Args:
        listeners: told about every round, after its ``privacy`` is set.
        settings: the run's privacy settings (``--dp`` none: summaries carry no ``privacy``).
        cohort: sites sampled per round (central DP's noise is sized for this many).
        recorded: the ``privacy`` of the run's last recorded round (a resume), whose
            accountant state the ledger continues; ``None``: a new run.

    With ``--max-epsilon`` the ledger is also the run's budget: ``next_round_problem`` says
    when a round with every sampled site would cross it (the round is not started), and
    ``release_problem`` when the mean a round actually has would (central DP: fewer sites
    under the same noise spend more; the aggregate is then not released).
    """

    def __init__(
        self,
        listeners: Sequence[Any],
        settings: PrivacySection,
        cohort: int,
        recorded: dict[str, Any] | None = None,
    ) -> None:
        self.listeners = list(listeners)
        self.settings = settings
        self.cohort = cohort
        composed = settings.dp in ("central", "local")  # sample: the sites account
        self.max_epsilon = settings.max_epsilon if composed else None
        self._refused: str | None = None
        self.accountant = accountant(settings.dp_delta, cohort) if composed else None
        self.releases: list[list[float | int]] = []  # [noise multiplier, rounds] in order
        self.site_epsilon: dict[str, float] = {}  # sample DP: each site's latest own word
        if self.accountant is not None and recorded:
            for multiplier, count in _recorded_releases(recorded):
                self._compose(multiplier, count)
        if settings.dp == "sample" and recorded:
            self.site_epsilon = _recorded_sites(recorded)

    def on_round(self, summary: Any) -> None:
        if self.accountant is not None:
            summary.privacy = self._spend(summary)
        elif self.settings.dp == "sample":
            summary.privacy = self._sites_spent(summary)
        for listener in self.listeners:
            listener.on_round(summary)

    def _sites_spent(self, summary: Any) -> dict[str, Any]:
        """Sample DP: the epsilon each site reported (its own ledger); the run's is the most
        any site's data has spent. A figure that is missing or not a finite number >= 0 is
        not taken (the round says so); the site's earlier one stands."""
        for site in summary.sites:
            if site.status != "ok":
                continue
            said = site.metrics.get(SAMPLE_DP_EPSILON_METRIC)
            if said is None:
                summary.warnings = [
                    *summary.warnings,
                    f"site {site.site_id} replied without the epsilon its ledger holds (a "
                    "sample-DP site reports it with every update); its earlier figure stands",
                ]
                continue
            number = isinstance(said, (int, float)) and not isinstance(said, bool)
            earlier = self.site_epsilon.get(site.site_id, 0.0)
            if number and math.isfinite(said) and said < earlier:
                summary.warnings = [
                    *summary.warnings,
                    f"site {site.site_id} reported epsilon {said:.3f}, less than the "
                    f"{earlier:.3f} it reported before: its own ledger was lost or replaced; "
                    "its earlier figure stands",
                ]
            elif number and math.isfinite(said) and said >= 0:
                self.site_epsilon[site.site_id] = float(said)
            else:
                summary.warnings = [
                    *summary.warnings,
                    f"site {site.site_id} reported epsilon {said!r}, not a number >= 0; its "
                    "earlier figure stands",
                ]
        return {
            "epsilon": max(self.site_epsilon.values(), default=0.0),
            "delta": self.settings.dp_delta,
            "sites": dict(sorted(self.site_epsilon.items())),
            "round_noise_multiplier": None,
        }

    @property
    def epsilon(self) -> float:
        """What the rounds composed so far spent, at the run's delta."""
        if self.accountant is None or not self.accountant.num_releases:
            return 0.0
        return self.accountant.get_privacy_spent().epsilon

    def epsilon_after(self, multiplier: float) -> float:
        """What the run would have spent after one more release of ``multiplier``."""
        projected = accountant(self.settings.dp_delta, self.cohort)
        for earlier, count in [*self.releases, (multiplier, 1)]:
            compose(projected, self.cohort, earlier, count)
        return projected.get_privacy_spent().epsilon

    def fit_config(self) -> dict[str, str | float]:
        """What every training instruction says of the run's privacy, for the sites' own
        floors (``client/mods.py``'s ``privacy_floor``): the mechanism and, under DP, the
        ledger's epsilon after the coming round with every sampled site in it."""
        if self.settings.dp == "sample":
            return {DP_MODE_KEY: "sample", DP_DELTA_KEY: self.settings.dp_delta}
        if self.accountant is None:
            return {DP_MODE_KEY: "none"}
        return {
            DP_MODE_KEY: self.settings.dp,
            DP_EPSILON_AFTER_KEY: self.epsilon_after(round_multiplier(self.settings)),
            DP_DELTA_KEY: self.settings.dp_delta,
        }

    def next_round_problem(self, round_number: int) -> str | None:
        """Why round ``round_number`` must not start under ``--max-epsilon`` (``None``: it
        may): with every sampled site in it, it would cross the budget, or an earlier round's
        aggregate was already held back for that."""
        if self.max_epsilon is None:
            return None
        if self._refused is not None:
            return self._refused
        after = self.epsilon_after(round_multiplier(self.settings))
        if after <= self.max_epsilon:
            return None
        return (
            f"privacy budget: stopped before round {round_number}, which would take epsilon "
            f"from {self.epsilon:.3f} to {after:.3f}, past --max-epsilon {self.max_epsilon:g} "
            f"(delta {self.settings.dp_delta:g})"
        )

    def release_problem(self, round_number: int, in_mean: int) -> str | None:
        """Why central DP's aggregate of round ``round_number``, a mean of ``in_mean`` sites,
        must not be released under ``--max-epsilon`` (``None``: it may)."""
        if self.max_epsilon is None or self.settings.dp != "central" or in_mean < 1:
            return None
        after = self.epsilon_after(self.settings.noise_multiplier)
        if after <= self.max_epsilon:
            return None
        self._refused = (
            f"privacy budget: round {round_number}'s aggregate was not released: a mean of "
            f"{in_mean} of {self.cohort} sites would take epsilon from {self.epsilon:.3f} to "
            f"{after:.3f}, past --max-epsilon {self.max_epsilon:g}; the global model was kept"
        )
        return self._refused

    def _compose(self, multiplier: float, count: int = 1) -> None:
        compose(self.accountant, self.cohort, multiplier, count)
        if self.releases and self.releases[-1][0] == multiplier:
            self.releases[-1][1] += count
        else:
            self.releases.append([multiplier, count])

    def _spend(self, summary: Any) -> dict[str, Any]:
        multiplier = round_noise_multiplier(self.settings, self.cohort, summary)
        if multiplier is not None:
            self._compose(multiplier)
        return {
            "epsilon": self.epsilon,
            "delta": self.settings.dp_delta,
            "releases": self.accountant.num_releases,
            "round_noise_multiplier": multiplier,
            "composed": [list(run) for run in self.releases],
        }


def _recorded_releases(recorded: dict[str, Any]) -> list[tuple[float, int]]:
    """The ``[noise multiplier, rounds]`` runs a recorded round's ledger composed."""
    runs = recorded.get("composed")
    try:
        parsed = [(float(multiplier), int(count)) for multiplier, count in runs]
    except (TypeError, ValueError) as exc:
        raise UserError(
            f"the run's recorded privacy ledger is unreadable ({exc}); it cannot be continued "
            "without losing what the run spent"
        ) from exc
    if any(not multiplier > 0 or count < 1 for multiplier, count in parsed):
        raise UserError(
            "the run's recorded privacy ledger holds a release without noise; it cannot be "
            "continued"
        )
    return parsed


def check_resumable(settings: PrivacySection, recorded: dict[str, Any] | None, rounds: int) -> None:
    """Refuse, in one line, to resume a DP run after ``rounds`` recorded rounds whose next
    round the ``--max-epsilon`` budget would not allow: nothing could run."""
    if recorded is None or settings.dp == "none" or settings.max_epsilon is None:
        return
    problem = PrivacyLedger([], settings, 1, recorded).next_round_problem(rounds + 1)
    if problem is not None:
        raise UserError(f"nothing to resume: {problem}")


def _recorded_sites(recorded: dict[str, Any]) -> dict[str, float]:
    """Sample DP: each site's epsilon as the run's last recorded round kept it."""
    sites = recorded.get("sites")
    if not isinstance(sites, dict):
        raise UserError(
            "the run's recorded privacy ledger holds no site's epsilon; it cannot be continued"
        )
    return {
        str(k): float(v)
        for k, v in sites.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    }
