"""Slotted rounds: peers agree, by gossip, on when each round starts and how long it lasts.

Asynchronous gossip evaluates each peer right after its own exchanges, while its neighbours
still carry their freshest local training: the peers then disagree far more than the same
exchanges would leave them after a common training step. Slots give every round the shape
of synchronous gossip: all train, then all mix, then all evaluate.

No wall clock is shared (PROTOCOL.md §7.1). Every message carries the sender's slot as
``[round, offset, length]``: the round whose slot it last anchored, the seconds from sending
until that slot starts (negative once it has started) and the slot length it uses. The
receiver maps it onto its own monotonic clock, so clocks that disagree by any amount do not
matter; only the transit time does, and it only makes a slot look later.

- **Phase**: a peer follows the most advanced slot lattice it hears of. When the sender has
  reached our anchored round and its lattice starts that round earlier than ours by more than
  ``PHASE_TOLERANCE`` of a slot, we adopt it. Transit delays make lattices look later, never
  earlier, so adoption never overshoots the leader and the network settles on one lattice. A
  lattice is never extrapolated past its owner's round: a peer stuck in a long round does
  not look ahead.
- **Catching up**: round ``r + 1`` follows round ``r``; rounds are never skipped. A round
  that reaches its slot more than ``LATE_START_LIMIT`` of a slot late starts at once: at the
  peer's own pace the lattice moves with it (an overrun), behind an adopted leader's round
  the lattice stays and the late rounds run back to back until they are back in step. So a
  newcomer, or a peer that waited out a dead neighbour, catches up in a few short rounds,
  and every peer runs every round it was asked for.
- **Length**: each peer proposes ``SLOT_MARGIN`` times the median of its last
  ``WORK_WINDOW`` rounds' work (train, exchange, evaluate; not the waits). Its slot length is
  the median of its own proposal and the lengths its members said they use (heard in the last
  ``PROPOSAL_TTL_SLOTS`` slots), rounded up to ``SLOT_GRANULARITY`` within
  ``[MIN_SLOT_SECONDS, MAX_SLOT_SECONDS]``, so the network settles on one length and no
  single peer sets the pace: a slow peer runs late instead of slowing everyone.
  ``--round-interval T`` fixes the length at ``T``; phases are still agreed.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from fedweave.gossip.wire import MAX_SLOT_LENGTH_SECONDS as MAX_SLOT_SECONDS

SLOT_GRANULARITY = 0.05
MIN_SLOT_SECONDS = 0.1
SLOT_MARGIN = 1.5
WORK_WINDOW = 5
PHASE_TOLERANCE = 0.05
LATE_START_LIMIT = 0.5
PROPOSAL_TTL_SLOTS = 20

SlotField = tuple[int, float, float]
"""A message's ``slot``: (round, seconds from sending until its slot starts, length)."""


def schedule_for(round_interval: float | None) -> SlotSchedule | None:
    """``--round-interval``: ``None`` agreed slots, ``0`` none (back to back), ``T`` fixed."""
    if round_interval is None:
        return SlotSchedule()
    return SlotSchedule(fixed=round_interval) if round_interval > 0 else None


def proposal_from(works: list[float]) -> float:
    """The slot length a peer proposes from its recent rounds' work (seconds)."""
    return _granular(SLOT_MARGIN * statistics.median(works))


def _granular(seconds: float) -> float:
    """Up to a multiple of ``SLOT_GRANULARITY``, within the slot limits: peers that hear
    slightly different values still land on the same length."""
    rounded = math.ceil(seconds / SLOT_GRANULARITY - 1e-9) * SLOT_GRANULARITY
    return min(MAX_SLOT_SECONDS, max(MIN_SLOT_SECONDS, round(rounded, 6)))


@dataclass
class SlotSchedule:
    """One peer's slot lattice: round ``r`` starts at ``anchor_start + (r - anchor_round) * L``.

    Attributes:
        fixed: the slot length from ``--round-interval`` (proposals then ignored), or ``None``
            to agree on one from measured work.
        anchor_round / anchor_start: a round and its slot's start (``time.monotonic()``);
            ``None`` until the first round starts or a lattice is heard.
        works: this peer's recent rounds' work in seconds.
        heard: sender → (the slot length it uses, when heard).
    """

    fixed: float | None = None
    anchor_round: int | None = None
    anchor_start: float = 0.0
    works: deque[float] = field(default_factory=lambda: deque(maxlen=WORK_WINDOW))
    heard: dict[str, tuple[float, float]] = field(default_factory=dict)

    # -- the agreed length ---------------------------------------------------------------

    def proposal(self) -> float | None:
        """This peer's proposed length (``None`` before its first measured round)."""
        if self.fixed is not None:
            return self.fixed
        return proposal_from(list(self.works)) if self.works else None

    def length(self, now: float) -> float | None:
        """The slot length now: fixed, or the median of this peer's proposal and the lengths
        its members use (``None``: none yet)."""
        if self.fixed is not None:
            return self.fixed
        own = self.proposal()
        ttl = PROPOSAL_TTL_SLOTS * (own or MAX_SLOT_SECONDS)
        for sender in [s for s, (_, at) in self.heard.items() if now - at > ttl]:
            del self.heard[sender]
        lengths = [p for p, _ in self.heard.values()] + ([own] if own is not None else [])
        return _granular(statistics.median(lengths)) if lengths else None

    def measured(self, work: float) -> None:
        """Record one round's work (seconds spent training, exchanging and evaluating)."""
        self.works.append(max(0.0, work))

    # -- the lattice ---------------------------------------------------------------------

    def start_of(self, round_: int, length: float) -> float:
        """When ``round_``'s slot starts (monotonic), on the current lattice."""
        assert self.anchor_round is not None
        return self.anchor_start + (round_ - self.anchor_round) * length

    def next_round(self, after: int, now: float) -> tuple[int, float, float | None]:
        """When round ``after + 1`` runs: (round, slot start, slot length).

        On time it keeps its slot (waiting for it, or a little late, within
        ``LATE_START_LIMIT`` of a slot); later than that it starts ``now``. The length is
        ``None`` for an unslotted round (nothing measured or heard yet). With no lattice yet
        the round starts ``now`` and anchors one. Pure: ``begin`` commits the choice.
        """
        length = self.length(now)
        if self.anchor_round is None or length is None:  # the first round sets the lattice
            return after + 1, now, length
        start = self.start_of(after + 1, length)
        late = start < now - LATE_START_LIMIT * length
        return after + 1, now if late else start, length

    def begin(self, round_: int, start: float) -> None:
        """Round ``round_`` starts at ``start``. At our own pace the lattice is re-anchored
        there, so an overrun moves it and a change of length moves only the slots to come;
        up to an adopted leader's round it is kept, and late rounds run back to back until
        they are back in step."""
        if self.anchor_round is None or round_ > self.anchor_round:
            self.anchor_round, self.anchor_start = round_, start

    # -- the wire ------------------------------------------------------------------------

    def advertise(self, now: float) -> SlotField | None:
        """This peer's ``slot`` field for a message sent now (``None``: nothing agreed yet)."""
        length = self.length(now)
        if self.anchor_round is None or length is None:
            return None
        return self.anchor_round, self.anchor_start - now, length

    def observe(self, sender: str, slot: SlotField | None, now: float) -> bool:
        """Take in a received ``slot`` field; True when it moved this peer's lattice."""
        if slot is None:
            return False
        round_, offset, proposal = slot
        if self.fixed is None:
            self.heard[sender] = (proposal, now)
        length = self.length(now)
        if length is None:
            return False
        theirs = now + offset
        if self.anchor_round is not None:
            if round_ < self.anchor_round:  # it has not reached our round: never ahead
                return False
            at_ours = theirs - (round_ - self.anchor_round) * length
            if at_ours >= self.anchor_start - PHASE_TOLERANCE * length:
                return False
        self.anchor_round, self.anchor_start = round_, theirs
        return True
