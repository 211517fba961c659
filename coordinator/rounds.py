"""What the coordinator tells listeners after each round (progress, report, history)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import numpy as np

from fedweave.history.records import SiteResult


@dataclass
class RoundSummary:
    """One aggregated and centrally evaluated round.

    Attributes:
        round: 1-based number; continues after a resume.
        loss / accuracy: central evaluation of the new global model on the held-out set.
        seconds: wall time from sampling the sites to the end of central evaluation.
        weights: the new global model, in state-dict order.
        sites: one result per sampled site (ok, failed, rejected or late).
        train_metrics: training metrics averaged over sites, weighted by examples.
        warnings: one line each for what the run should know (clipping, rejected aggregate).
        failed: why the round failed (fewer replies than ``--min-replies``; the global model
            was kept), or ``None`` for a round that aggregated.
        statistics: the federated statistics the sites gathered before round 1, on the first
            round after they were gathered (recorded with it, so a resume reuses them).
    """

    round: int
    loss: float
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

    @property
    def sampled(self) -> int:
        return len(self.sites)

    @property
    def replied(self) -> int:
        return sum(1 for site in self.sites if site.status == "ok")


def shown(value: float | None, digits: int = 4) -> str:
    """A metric for a console line: ``-`` when the task has none (accuracy in a regression)."""
    return "-" if value is None else f"{value:.{digits}f}"


class RoundListener(Protocol):
    """Receives each completed round, in order, on the coordinator's thread."""

    def on_round(self, summary: RoundSummary) -> None: ...
