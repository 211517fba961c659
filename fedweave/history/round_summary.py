"""The federated round as the history stores it: what the coordinator tells listeners as each
round starts and after it (progress, report, history).

It lives with the history, not in ``coordinator/``: the coordinator's round loop
(``coordinator/rounds/``) produces it, ``coordinator/rounds/history_listener.py`` records it,
and ``fedweave simulate`` reports it, none of them needing the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import numpy as np

from fedweave.history.records import RoundInFlight, SiteResult


@dataclass
class RoundSummary:
    """One aggregated and evaluated round.

    Attributes:
        round: 1-based number; continues after a resume.
        loss / accuracy: the round's headline figures for the new global model: the central
            evaluation's when the coordinator holds test data, else the federated
            evaluation's example-weighted mean; ``None`` when the round was not evaluated
            (``--evaluate-every``) or the task has no accuracy (regression).
        seconds: wall time from sampling the sites to the end of the round's evaluation.
        weights: the new global model, in state-dict order.
        sites: one result per sampled site (ok, failed, rejected or late).
        train_metrics: training metrics averaged over sites, weighted by examples.
        warnings: one line each for what the run should know (clipping, rejected aggregate).
        failed: why the round failed (fewer replies than ``--min-replies``; the global model
            was kept), or ``None`` for a round that aggregated.
        statistics: the federated statistics the sites gathered before round 1, on the first
            round after they were gathered (recorded with it, so a resume reuses them).
        central: every metric of the central evaluation (``loss`` included); empty without
            test data at the coordinator.
        federated: every metric of the federated evaluation, weighted by the evaluating
            sites' examples (``loss`` included); empty in a round no site evaluated.
        evaluations: one result per site asked to evaluate (ok with its metrics and example
            count, failed or late with the reason).
        cross_site: after the last round with ``--cross-site``: one result per (model, site),
            the model (``"global"`` or its owner site) in ``metrics["model"]``.
        deadline_seconds: how long the round's training waited for its sites (``None``: no
            deadline).
        simulated_seconds / simulated_clock: with ``--site-speeds``, the round's length and
            the run's time at its end on the simulated clock (``None`` without one).
        bytes_in / bytes_out: data bytes the coordinator received from / sent to the sites
            in this round, training and evaluation (``coordinator/rounds/traffic.py``; ``None``: not
            counted).
        privacy: under ``--dp``, the run's cumulative spend after this round
            (``coordinator/rounds/privacy_ledger.py``): ``epsilon``, ``delta`` and, central
            and local, ``releases`` (rounds composed), ``round_noise_multiplier`` (``None``:
            the round released nothing) and ``composed`` (the ledger's state); sample,
            ``sites`` (each site's own epsilon); ``None`` without DP.
    """

    round: int
    loss: float | None
    accuracy: float | None
    seconds: float
    started_at: datetime
    ended_at: datetime
    weights: list[np.ndarray]
    sites: list[SiteResult] = field(default_factory=list)
    train_metrics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    failed: str | None = None
    statistics: dict[str, Any] | None = None
    central: dict[str, float] = field(default_factory=dict)
    federated: dict[str, float] = field(default_factory=dict)
    evaluations: list[SiteResult] = field(default_factory=list)
    cross_site: list[SiteResult] = field(default_factory=list)
    deadline_seconds: float | None = None
    simulated_seconds: float | None = None
    simulated_clock: float | None = None
    bytes_in: int | None = None
    bytes_out: int | None = None
    privacy: dict[str, Any] | None = None

    @property
    def sampled(self) -> int:
        return len(self.sites)

    @property
    def replied(self) -> int:
        return sum(1 for site in self.sites if site.status == "ok")


def evaluated(summary: RoundSummary, name: str) -> float | None:
    """The round's metric ``name`` for its new global model: the central evaluation's when
    the coordinator has test data, else the federated one; ``None`` when neither has it."""
    value = (summary.central or summary.federated).get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def shown(value: float | None, digits: int = 4) -> str:
    """A metric for a console line: ``-`` when the task has none (accuracy in a regression)."""
    return "-" if value is None else f"{value:.{digits}f}"


def privacy_spent(privacy: dict[str, Any] | None) -> str:
    """A DP run's ledger after a round (``RoundSummary.privacy``, as recorded), for a console
    line: ``  epsilon 1.234 (delta 1e-05)``; empty without DP."""
    if not privacy:
        return ""
    delta = privacy.get("delta")
    return f"  epsilon {privacy['epsilon']:.3f}" + (f" (delta {delta:g})" if delta else "")


class RoundListener(Protocol):
    """Receives each completed round, in order, on the coordinator's thread."""

    def on_round(self, summary: RoundSummary) -> None: ...


class RoundStartListener(Protocol):
    """Told when a round starts (before its sites are sampled), on the coordinator's
    thread."""

    def on_round_start(self, started: RoundInFlight) -> None: ...
