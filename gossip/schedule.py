"""Slotted rounds: with a round interval T, peers train at the same moments.

Asynchronous gossip evaluates each peer right after its own exchanges, while its neighbours
still carry their freshest local training: the peers then disagree far more than the same
exchanges would leave them after a common training step. Aligning rounds to wall-clock
multiples of T (clocks kept in sync by NTP, as on any managed host) gives every round the
shape of synchronous gossip: all train, then all mix, then all evaluate. No messages are
needed for it, and a peer that overruns its slot simply starts its next round late.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def slot_seconds(round_interval: float | None) -> float:
    """A peer's slot length: ``--round-interval`` when given, else 0 (rounds back to back; a
    deployment's peers cannot assume their clocks agree). Simulations pass 0.1 s explicitly."""
    return round_interval or 0.0


def next_boundary(now: float, interval: float) -> float:
    """The first wall-clock multiple of ``interval`` strictly after ``now``."""
    return (math.floor(now / interval) + 1) * interval


@dataclass
class SlotClock:
    """Round ``r`` owns ``[base + (r - first) * T, base + (r - first + 1) * T)``.

    Attributes:
        interval: the slot length T in seconds (> 0).
        base: wall-clock start of the first slot (``None`` until the first round).
        first: the round number that owns the first slot.
    """

    interval: float
    base: float | None = None
    first: int = 0

    def slot(self, round_: int, now: float) -> tuple[float, float]:
        """Wall-clock (start, end) of ``round_``'s slot; the first call anchors the clock at
        the next boundary after ``now``."""
        if self.base is None:
            self.base, self.first = next_boundary(now, self.interval), round_
        start = self.base + (round_ - self.first) * self.interval
        return start, start + self.interval
