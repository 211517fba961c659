"""Plain records passed to and from the history store (the contract both modes write).

The SQL tables live in ``fedweave.history.models``; these dataclasses are what the rest of
the code hands over, so callers never touch SQLAlchemy sessions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

COORDINATOR_ACTOR = "coordinator"
"""The ``actor`` of federated rounds; gossip rounds use the peer id instead."""


@dataclass
class SiteResult:
    """One site's (federated) or one neighbour's (gossip) part in a round.

    Attributes:
        site_id: Flower node id as text, or the gossip neighbour's peer id.
        status: ``"ok"``, ``"failed"``, ``"rejected"``, ``"refused"`` (the site cannot take
            part in the run), ``"lost"`` (the SuperLink lost it) or ``"late"`` (no reply by
            the round deadline).
        num_examples: examples the site trained on (0 when unknown).
        metrics: whatever the site reported (train_loss, train_accuracy, ...).
        seconds: the site's own training time, when known.
        reason: one line saying why, when status is not ``"ok"``.
    """

    site_id: str
    status: str = "ok"
    num_examples: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    seconds: float | None = None
    reason: str | None = None


@dataclass
class RoundRecord:
    """One completed round of one actor (the coordinator, or one gossip peer).

    Attributes:
        round: 1-based round number; continues across a resume.
        actor: ``COORDINATOR_ACTOR`` or a gossip peer id.
        started_at / ended_at: wall-clock times (UTC).
        sampled / replied / failed: participants asked, that answered, that failed
            (for gossip: neighbours contacted / answered / missed their deadline).
        train_metrics: aggregated training metrics (weighted by examples).
        eval_loss / eval_accuracy: central (federated) or own-model (gossip) evaluation.
        model_sha256: sha256 of the model bytes after this round.
        bytes_in / bytes_out: traffic of this round when known.
        extra: anything else worth keeping (e.g. consensus distance, warnings).
    """

    round: int
    actor: str
    started_at: datetime
    ended_at: datetime
    sampled: int = 0
    replied: int = 0
    failed: int = 0
    train_metrics: dict[str, Any] = field(default_factory=dict)
    eval_loss: float | None = None
    eval_accuracy: float | None = None
    model_sha256: str | None = None
    bytes_in: int | None = None
    bytes_out: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RoundInFlight:
    """The coordinator's round now under way, noted when it starts (``note_round_started``)
    and cleared when it is recorded or the run ends.

    Attributes:
        round: its 1-based number.
        started_at: when its sites were asked (UTC).
        deadline_seconds: how long its training waits for the sites (``None``: no deadline).
        sampled: sites it asks to train (the strategy's sample size for the sites connected).
        connected: sites connected to the coordinator when it started.
    """

    round: int
    started_at: datetime
    deadline_seconds: float | None
    sampled: int
    connected: int


@dataclass(frozen=True)
class SitesWait:
    """The run waiting for sites: fewer are connected than its next step needs
    (``--min-clients``), noted while it waits and cleared when they are back.

    Attributes:
        since: when the wait began (UTC).
        connected: sites connected now.
        needed: sites the next step needs.
        missing: names of sites that took part in this run and are not connected now.
        gives_up_at: when the run ends interrupted unless they join (``--wait-for-sites``).
    """

    since: datetime
    connected: int
    needed: int
    missing: tuple[str, ...]
    gives_up_at: datetime

    def line(self) -> str:
        missing = f" (missing: {', '.join(self.missing)})" if self.missing else ""
        return (
            f"waiting for sites: {self.connected} of {self.needed} connected since "
            f"{self.since:%H:%M:%S} UTC{missing}; the run goes on when they join and ends "
            f"interrupted (resumable) at {self.gives_up_at:%H:%M:%S} UTC otherwise "
            "(--wait-for-sites)"
        )


@dataclass
class CheckpointRef:
    """A model checkpoint written to disk (atomically) before its round is recorded."""

    round: int
    path: str
    sha256: str
    size_bytes: int


@dataclass
class RunInfo:
    """A run as read back from the store."""

    run_id: str
    mode: str
    task: str
    status: str
    config: dict[str, Any]
    seed: int | None
    code_version: str
    started_at: datetime
    ended_at: datetime | None
    reason: str | None
    rounds_completed: int
    """Highest round number recorded by any actor (0 before the first round)."""
    pid: int | None = None
    hostname: str | None = None
    heartbeat_at: datetime | None = None
    """Refreshed by every recorded round; used to detect runs whose process died."""
    actors: int = 0
    """Distinct actors that recorded rounds (1 for federated, the peer count for gossip)."""
    round_in_flight: RoundInFlight | None = None
    """The coordinator's round under way (federated runs that are running), if noted."""
    sites_wait: SitesWait | None = None
    """The run waiting for sites to connect (federated runs that are running), if it is."""
