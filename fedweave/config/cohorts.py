"""What a federated round draws from its sites, computed from the options alone: the cohort,
an asynchronous run's buffer, and the SecAgg+ shares a cohort gets.

Declared in the core because the option rules (``rules.py``) and the coordinator's round loop
(``coordinator/rounds/``) must compute them the same way; the core imports no mode.
"""

from __future__ import annotations

import math

from fedweave.errors import UserError

MIN_SECAGG_COHORT = 3
"""The fewest sites a SecAgg+ sum may cover: with fewer, the sum reveals each site's update."""


def secagg_cohort_problem(cohort: int) -> str | None:
    """Why ``cohort`` sites cannot form a SecAgg+ round, or None."""
    if cohort >= MIN_SECAGG_COHORT:
        return None
    return (
        f"SecAgg+ needs at least {MIN_SECAGG_COHORT} sites per round (got {cohort}): with "
        "fewer, the sum reveals each site's update; add sites or pass --no-secure-agg"
    )


def derive_shares(cohort: int) -> tuple[int, int]:
    """(num_shares, reconstruction_threshold) for ``cohort`` sites per round.

    Every site shares with all others up to 5 sites; above that with an odd
    ``2*floor(sqrt(cohort))+1`` neighbours (SecAgg+'s logarithmic-degree idea, kept generous
    for small cohorts). The threshold is a strict majority of the shares, so a round survives
    any site losing up to ``shares - threshold`` of its neighbours.
    """
    problem = secagg_cohort_problem(cohort)
    if problem is not None:
        raise UserError(problem)
    shares = cohort if cohort <= 5 else min(cohort, 2 * math.isqrt(cohort) + 1)
    return shares, shares // 2 + 1


def round_cohort(clients_per_round: int | None, sites: int) -> int:
    """Sites sampled per round: ``--clients-per-round``, else every site a round draws from."""
    return clients_per_round or sites


def async_buffer(given: int | None, sites: int, secure_agg: bool) -> int:
    """Async: site updates per model step (``--buffer``; default a third of the sites, at
    least 2, under SecAgg+ at least ``MIN_SECAGG_COHORT``, at most all)."""
    if given is not None:
        return given
    floor = MIN_SECAGG_COHORT if secure_agg else 2
    return min(sites, max(floor, sites // 3))
