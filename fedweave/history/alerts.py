"""Stall alerts read from the history: a round past its deadline, a site late round after
round. One definition for the dashboard, its Prometheus gauges and the coordinator's warning
lines, so all three say the same thing.

A federated round waits up to its deadline for training and up to the deadline again for its
evaluation, so a round is *overdue* once ``2 × deadline + grace`` seconds have passed since
its sites were asked (the round in flight, ``RunInfo.round_in_flight``) and it is still not
recorded. A site is *late in a row* when it was recorded ``late`` in each of its last ``N``
rounds (rounds it was not asked in neither count nor break the streak).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fedweave.history.records import RunInfo

DEFAULT_LATE_IN_A_ROW = 3
"""``--stall-after``: late rounds in a row before a site is flagged."""
DEFAULT_STALL_GRACE_SECONDS = 60.0
"""``--stall-grace``: seconds past a round's deadlines before the round is flagged."""


@dataclass(frozen=True)
class AlertRules:
    """When the history's figures turn into alerts.

    Attributes:
        late_in_a_row: a site recorded late in this many of its rounds in a row is flagged
            (default 3).
        grace_seconds: a round in flight is flagged this long after its training and
            evaluation deadlines have both passed (default 60 s).
    """

    late_in_a_row: int = DEFAULT_LATE_IN_A_ROW
    grace_seconds: float = DEFAULT_STALL_GRACE_SECONDS


@dataclass(frozen=True)
class OverdueRound:
    """A round in flight past its deadlines and grace."""

    round: int
    seconds_running: float
    deadline_seconds: float
    overdue_seconds: float

    def line(self) -> str:
        return (
            f"round {self.round} has run {self.seconds_running:.0f} s, "
            f"{self.overdue_seconds:.0f} s past its deadline ({self.deadline_seconds:g} s for "
            "training, the same for evaluation) and the grace; check the coordinator's log"
        )


@dataclass(frozen=True)
class LateSite:
    """A site recorded late in each of its last ``len(rounds)`` rounds."""

    site: str
    rounds: tuple[int, ...]
    reason: str | None

    def line(self) -> str:
        first, last = self.rounds[0], self.rounds[-1]
        span = f"rounds {first}-{last}" if first != last else f"round {first}"
        return (
            f"site {self.site} late {len(self.rounds)} rounds in a row ({span}): "
            f"{self.reason or 'no reply within the round deadline'}; is it up?"
        )


def overdue_round(run: RunInfo, now: datetime, rules: AlertRules) -> OverdueRound | None:
    """The run's round in flight when it is past ``2 × deadline + grace``; ``None`` when the
    run is not running, has no round in flight or that round has no deadline."""
    started = run.round_in_flight
    if run.status != "running" or started is None or started.deadline_seconds is None:
        return None
    running = (now - started.started_at).total_seconds()
    overdue = running - (2 * started.deadline_seconds + rules.grace_seconds)
    if overdue <= 0:
        return None
    return OverdueRound(started.round, running, started.deadline_seconds, overdue)


class LateStreaks:
    """Each site's current run of ``late`` records, fed site row by site row in round order
    (``store.site_results`` or a round's rows as they are recorded)."""

    def __init__(self) -> None:
        self._late: dict[str, tuple[list[int], str | None]] = {}

    def add(self, round_number: int, site: str, status: str, reason: str | None) -> None:
        rounds, last_reason = self._late.get(site, ([], None))
        if status == "late":
            self._late[site] = ([*rounds, round_number], reason or last_reason)
        else:
            self._late[site] = ([], None)

    def add_rows(self, site_rows: Iterable[dict[str, Any]]) -> None:
        for row in sorted(site_rows, key=lambda r: (int(r["round"]), str(r["site_id"]))):
            self.add(int(row["round"]), str(row["site_id"]), str(row["status"]), row.get("reason"))

    def streak(self, site: str) -> list[int]:
        """The rounds of ``site``'s current run of late records (empty when its last was not)."""
        return list(self._late.get(site, ([], None))[0])

    def flagged(self, rules: AlertRules) -> list[LateSite]:
        """Sites late in at least ``rules.late_in_a_row`` of their rounds in a row, by name."""
        return [
            LateSite(site, tuple(rounds), reason)
            for site, (rounds, reason) in sorted(self._late.items())
            if rules.late_in_a_row > 0 and len(rounds) >= rules.late_in_a_row
        ]
