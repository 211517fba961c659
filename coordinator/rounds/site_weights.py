"""A site's weight in a round's mean is bounded by its cohort, not by its own word.

A site says how many examples it trained or evaluated on, and FedAvg (Flower's, and every
strategy here that weighs by count) weighs its update by that figure. One registered site
sending zeros and claiming 10**12 examples made the mean its own: every site fell to chance.

So in every mean of a round (the fit results a strategy aggregates, the sites' evaluation
figures) a count weighs in with at most ``MAX_TIMES_MEDIAN`` times the lower median of the
counts in that mean. With one insider among three or more sites the lower median is an honest
site's count, so whatever it claims, the insider weighs at most as much as two median sites;
a federation whose sites differ in size by less than that keeps FedAvg's weights exactly, and
a larger site keeps a larger weight, only not an unbounded one. (With two sites, no
count-based rule can tell which one lies: their counts stand, ``MIN_SITES_TO_BOUND``.) The
claimed count is still what the history records, and the round records a warning naming
the site.

Why 2: replayed on digits (five sites, one sending zeros with 10**12, 5 plain rounds;
``tests/test_site_weights.py``), the model ended at 0.10 unbounded, 0.27 with 4, 0.65 with 2
and 0.77 with 1 (0.88 without the insider). The rest of that gap is what the insider sends,
at one bounded weight: the robust strategies (``trimmedavg``, ``fedmedian``, ``krum``) are for
that. A bound of 1 would also take every honest site's size above the median out of FedAvg's
weights, and note half the sites of an honest round.

Why not a fixed cap (SecAgg+'s ``max_weight``, 10,000): beside sites of a few hundred
examples, a claim of 10,000 is still most of the mean. Why not rejection: an honest site far
larger than the others would then be left out; its weight is bounded instead.

FedBuff (``fedbuff.py``) bounds the counts of a buffer's updates the same way, by the median of
the latest count of every site that has delivered one in the run: a buffer holds as few as two
updates, too few for its own median to say which one lies.

Under SecAgg+ the coordinator sees only the sum, whose weights the sites' own masked vectors
carry; a count above ``max_weight`` is refused there before unmasking
(``site_outcomes.OutcomeGrid``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

MAX_TIMES_MEDIAN = 2.0
"""A count weighs in with at most this many times the lower median count of its mean."""
MIN_SITES_TO_BOUND = 3
"""Counts in a mean below which none is bounded: of two sites, either may be the one lying,
and bounding would only cut an honest larger site down to twice the smaller."""


def count_bound(counts: Sequence[float], times: float = MAX_TIMES_MEDIAN) -> float:
    """The most any one of ``counts`` (or of other per-site figures) weighs in with: ``times``
    the lower median of those above 0 (a count of 0 weighs nothing either way); infinite for
    fewer than ``MIN_SITES_TO_BOUND`` of them."""
    positive = [count for count in counts if count > 0]
    if len(positive) < MIN_SITES_TO_BOUND:
        return float("inf")
    return times * float(statistics.median_low(positive))


def bounded_results(
    results: Sequence[tuple[Any, Any]],
) -> tuple[list[tuple[Any, Any]], list[str]]:
    """``results`` (``(proxy, FitRes or EvaluateRes)`` pairs) with each count above
    ``count_bound`` of all of them lowered to it, and one line per lowered count naming its
    site (node id) and both figures."""
    bound = count_bound([float(res.num_examples) for _, res in results])
    kept, notes = [], []
    for proxy, res in results:
        if res.num_examples > bound:
            weight = int(bound)
            notes.append(bounded_note(proxy.node_id, res.num_examples, weight, "round's"))
            res = replace(res, num_examples=weight)
        kept.append((proxy, res))
    return kept, notes


def bounded_note(node_id: int, claimed: float, weight: int, whose: str) -> str:
    """The round's warning for a count ``claimed`` by the site of ``node_id`` that weighed in
    as ``weight``, the bound taken over ``whose`` sites (``"round's"``, ``"run's"``)."""
    return (
        f"site {node_id} claimed {claimed:g} examples; weighed in as {weight} "
        f"({MAX_TIMES_MEDIAN:g} x the {whose} median site)"
    )
