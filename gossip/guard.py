"""What a neighbour's word is worth: a bounded example count and a bounded model distance.

A gossip peer mixes models it did not train, sent by peers it cannot audit. Two things a
neighbour states decide how far one exchange moves us: its example count (the mixing weight)
and its model (the direction and length of the move). Neither is trusted:

- **Example counts are capped relative to our own** (``counted_examples``): a neighbour's
  count weighs at most ``example_ratio`` times ours (default 10). Honest sites within that
  ratio of each other are weighted exactly as before (the pairwise sum stays exact); a claim
  of 2^53 examples moves us at most ``ratio / (ratio + 1)`` of the way, never all of it. A
  fixed absolute cap would not do: a claim at the cap still dwarfs a 300-example site.
- **A model far from ours is refused** (``DistanceGuard``): farther than ``factor`` times the
  90th percentile of the last ``window`` distances we accepted. Honest neighbours train the
  same task from the same kind of data, so their distances to us move slowly from round to
  round; a model of 1e30s is 1e30 times farther. The bound adapts as training converges
  (distances shrink) or diverges, but an accepted distance is recorded as at most
  ``GROWTH`` times the current percentile, and once ``MIN_SENDERS`` senders have distances
  in the window the percentile is taken sender by sender and the lower median of theirs is
  the typical distance: a member sending models just inside the bound cannot raise it (the
  growth cap alone let it double the bound every tenth of a window: issue 39's drift).
- **One pairwise exchange moves us at most one typical distance** (``radius``): a model
  farther than ``RADIUS_FACTOR`` typical distances (before ``WARMUP``: the lower median of
  each sender's largest accepted distance, once ``MIN_SENDERS`` have one) is mixed in part,
  the same part at both ends (``Exchange``; PROTOCOL.md §5.1), so the sum stays exact. A
  member that drifted its models along one direction at 5 typical distances took three
  digits peers to 0.100, 0.592 and 0.143; bounded to 1 they ended at 0.978-0.986, at 2 at
  0.896-0.969. The honest cost on 10 Dirichlet peers, 20 rounds, 3 seeds: digits 0.945 to
  0.936, mnist5k 0.921 to 0.917 (``docs/benchmarks.md``).

Why these numbers (digits, 20 rounds, every exchange logged: one run of 3 peers iid, one of
5 peers Dirichlet 0.5, replayed offline, then real runs): distances within one round are
bimodal. The first exchange after local training is several times the follow-ups between
already-mixed models (some are 0), and with fanout 4 most of a window are follow-ups. So a
bound of 5 medians refused 22 honest models in the replay (honest distances reached 11
medians), 5 times the 75th percentile none in the replay but 1 to 3 per 5-peer run late in
training (ratios near 5), while the largest honest ratio to the 90th percentile was 1.8:
``factor`` 5 leaves nearly three times that. The ``window`` of 32 spans 3 to 8 rounds. A
refusal costs one exchange, and never the pairwise sum when we answer an offer (neither
side mixes).

Until ``WARMUP`` (16) distances are known, and always as an outer limit, a model farther than
``ABSOLUTE_FACTOR`` (100) times the length of our own model (at least 1) is refused: two
models of one task are never a hundred model-lengths apart, while 1e30s are. This outer limit
is all a peer has in its first 16 exchanges, so a member that attacks then can still move it
that far once: ``--mix clipped`` or ``trimmed`` bound that too. Below ``FLOOR_FACTOR`` of our
model's length a move is always accepted (converged models differ by rounding noise, whose
spread says nothing).

If we refuse ``RESET_AFTER`` models in a row from at least two different neighbours whose
models we accepted before, and accept none, we are the outlier (our own model moved, or we
were poisoned before the bound knew better): the history restarts, so a peer is never shut
out of its network for good. Refusals of senders never accepted do not count: without CURVE
(``--insecure``) an id is only a claim, and three made-up ids sending garbage restarted the
history, after which a model at distance 948 was taken (issue 39). The bar this raises: a
made-up id must first have a model accepted, so it must know one close to ours.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

import numpy as np

from fedweave.gossip import averaging

DEFAULT_EXAMPLE_RATIO = 10.0
DEFAULT_DISTANCE_FACTOR = 5.0
WINDOW = 32
"""Accepted distances the quantile is taken over: several rounds at fanout 4."""
QUANTILE = 0.9
"""Which quantile of them is the typical distance (see above for why not the median)."""
GROWTH = 2.0
"""An accepted distance is recorded as at most this many typical distances (see above)."""
WARMUP = 16
"""Accepted distances needed before the quantile bound applies: about two rounds at fanout 4.
With 4, a bound learnt from round 1's mostly small follow-up distances refused an honest
first exchange of round 2 (3.11 against a bound of 2.83)."""
ABSOLUTE_FACTOR = 100.0
"""Outer limit, always on: a model farther than this many lengths of our own (at least
this many units: a zero-initialised model has no length) is refused."""
FLOOR_FACTOR = 0.01
"""A model closer than this share of our own length is always accepted."""
RESET_AFTER = 3
"""Refusals in a row (from two or more neighbours, no acceptance between) that restart it."""
MAX_KNOWN = 4096
"""Senders remembered as accepted once (without CURVE ids are free to make up)."""
RADIUS_FACTOR = 1.0
"""A ``pairwise`` exchange mixes at most this many typical distances of difference (see
above): against issue 39's drifting member, 1 held on three seeds, 2 did not."""
MIN_SENDERS = 3
"""Senders whose distances are known before the typical one is taken sender by sender."""


def counted_examples(claimed: int, own: int, ratio: float = DEFAULT_EXAMPLE_RATIO) -> int:
    """The example count a neighbour's model is weighted with: its claim, at most ``ratio``
    times our own (at least ``ratio`` itself, so a peer with no examples still mixes)."""
    return int(min(claimed, ratio * max(own, 1)))


def capped_share(share: float | None, n_other: int, n_self: int) -> float | None:
    """A group exchange's ``share`` (the offerer's word) is at most what a one-to-one
    exchange with its counted examples would give: honest shares ``n_s / N`` always are."""
    if share is None:
        return None
    total = n_self + n_other
    return min(share, 0.5 if total <= 0 else n_other / total)


class DistanceGuard:
    """Refuses models too far from ours; one per peer, fed by every model it considers.

    Args:
        factor: the bound in 90th percentiles of recent accepted distances; 0 turns that
            bound off (the absolute limit stays).
        window: how many accepted distances the quantile is taken over.
    """

    def __init__(self, factor: float = DEFAULT_DISTANCE_FACTOR, window: int = WINDOW) -> None:
        self.factor = factor
        self.accepted: deque[float] = deque(maxlen=max(1, window))
        self._senders: deque[str] = deque(maxlen=max(1, window))
        """Who sent each of ``accepted`` (the typical distance is taken sender by sender)."""
        self._refused_in_a_row: list[str] = []
        self._known: set[str] = set()
        """Senders a model of which was accepted (and recorded); bounded by the membership."""
        self.last_distance = math.nan
        """The distance of the last model checked (the consensus estimate reads it)."""

    def bound(self, ours: Mapping[str, np.ndarray]) -> float:
        """The largest distance from ``ours`` accepted now."""
        length = max(_length(ours), 1.0)
        limit = ABSOLUTE_FACTOR * length
        typical = self._typical()
        if self.factor > 0 and typical is not None:
            limit = min(limit, max(self.factor * typical, FLOOR_FACTOR * length))
        return limit

    def _typical(self) -> float | None:
        """The 90th percentile of the accepted distances, once there are ``WARMUP``: with
        ``MIN_SENDERS`` or more senders among them, the lower median of each sender's."""
        if len(self.accepted) < WARMUP:
            return None
        by_sender: dict[str, list[float]] = {}
        for sender, distance in zip(self._senders, self.accepted, strict=True):
            by_sender.setdefault(sender, []).append(distance)
        if len(by_sender) < MIN_SENDERS:
            return float(np.quantile(self.accepted, QUANTILE))
        typicals = sorted(float(np.quantile(d, QUANTILE)) for d in by_sender.values())
        return typicals[(len(typicals) - 1) // 2]

    def radius(self) -> float:
        """The longest difference one ``pairwise`` exchange mixes in full: ``RADIUS_FACTOR``
        typical distances (``inf`` until ``MIN_SENDERS`` senders are known, or while every
        distance is 0). A longer one is scaled down to it on both ends, so the sum stays
        exact (PROTOCOL.md §5.1)."""
        typical = self._typical()
        if typical is None:
            typical = self._provisional()
        return math.inf if typical is None or typical <= 0 else RADIUS_FACTOR * typical

    def _provisional(self) -> float | None:
        """Before ``WARMUP``: the lower median of each sender's largest accepted distance,
        once ``MIN_SENDERS`` senders have one."""
        by_sender: dict[str, float] = {}
        for sender, distance in zip(self._senders, self.accepted, strict=True):
            by_sender[sender] = max(distance, by_sender.get(sender, 0.0))
        if len(by_sender) < MIN_SENDERS:
            return None
        values = sorted(by_sender.values())
        return values[(len(values) - 1) // 2]

    def check(
        self,
        sender: str,
        theirs: Mapping[str, np.ndarray],
        ours: Mapping[str, np.ndarray],
        record: bool = True,
    ) -> str | None:
        """``None`` if ``theirs`` may be mixed into ``ours``, else why not (a short line).

        ``record``: an accepted distance joins the history (not for a late joiner's pull,
        whose distance from a fresh model says nothing about the network's spread)."""
        distance = averaging.difference_norm(theirs, ours)
        self.last_distance = distance
        limit = self.bound(ours)
        if math.isfinite(distance) and distance <= limit:
            if record:
                typical = self._typical()
                self.accepted.append(
                    distance if typical is None else min(distance, GROWTH * typical)
                )
                self._senders.append(sender)
                self._refused_in_a_row = []
                if len(self._known) < MAX_KNOWN:
                    self._known.add(sender)
            return None
        self._refused_in_a_row.append(sender)
        known = set(self._refused_in_a_row) & self._known
        if len(self._refused_in_a_row) >= RESET_AFTER and len(known) >= 2:
            self.accepted.clear()  # we are the outlier: learn the spread again
            self._senders.clear()
            self._refused_in_a_row = []
        return f"too-far: model at distance {distance:.3g} from ours, bound {limit:.3g}"


def _length(weights: Mapping[str, np.ndarray]) -> float:
    """L2 norm of a model's floating tensors."""
    total = 0.0
    for value in weights.values():
        if value.dtype.kind == "f":
            flat = value.astype(np.float64).ravel()
            total += float(np.dot(flat, flat))
    return math.sqrt(total)
