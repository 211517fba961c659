"""The simulated clock of a synchronous run with sites of unequal speed (``--site-speeds``).

Each site reports the simulated seconds its job took (``SIMULATED_SECONDS_METRIC``; at most
the simulated deadline, ``fedweave.learning.site_speeds``); a synchronous round lasts as long
as its slowest site, or until the simulated deadline when a site was too slow for it.
``SimulatedClock`` wraps the round listeners and writes both figures into each round's
summary, which the history keeps beside the wall-clock seconds. (The round's evaluation is
not on the simulated clock: it is the same for every schedule compared.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedweave.contract import SIMULATED_SECONDS_METRIC


def round_seconds(sites: Sequence[Any], deadline: float | None) -> float:
    """Simulated seconds of a synchronous round: its slowest replying site's job, or the
    deadline when a site was late or none replied (a SecAgg+ round that halted still waited
    for its sites; a round with no deadline waits for every site)."""
    reported = [
        float(value)
        for site in sites
        if site.status == "ok"
        and isinstance(value := site.metrics.get(SIMULATED_SECONDS_METRIC), (int, float))
    ]
    late = any(site.status == "late" for site in sites)
    if deadline is not None and (late or not reported):
        return float(deadline)
    return max(reported, default=0.0)


class SimulatedClock:
    """Round listeners whose summaries carry ``simulated_seconds`` and ``simulated_clock``.

    Args:
        listeners: told about every round, after the clock is set.
        deadline: the simulated round deadline (``--simulated-deadline``), or None.
        start: the clock when this process starts (a resumed run's recorded clock).
    """

    def __init__(self, listeners: Sequence[Any], deadline: float | None, start: float = 0.0):
        self.listeners = list(listeners)
        self.deadline = deadline
        self.clock = start

    def on_round(self, summary: Any) -> None:
        seconds = round_seconds(summary.sites, self.deadline)
        self.clock += seconds
        summary.simulated_seconds, summary.simulated_clock = seconds, self.clock
        for listener in self.listeners:
            listener.on_round(summary)
