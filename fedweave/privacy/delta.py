"""The most delta a site lets a DP run state its epsilon at: a site's own cap."""

from __future__ import annotations


def default_max_delta(examples: int) -> float:
    """A site's cap on delta where it names none: 1 / (10 x its training examples), so that a
    guarantee that may fail with probability delta cannot fail for one whole example."""
    return 1 / (10 * max(examples, 1))


def delta_problem(delta: float, examples: int, max_delta: float | None = None) -> str | None:
    """Why a round stating epsilon at ``delta`` is refused by a site of ``examples`` training
    examples whose cap is ``max_delta`` (``None``: ``default_max_delta``); ``None``: it is not."""
    cap = max_delta if max_delta is not None else default_max_delta(examples)
    if delta <= cap:
        return None
    why = (
        "--max-delta" if max_delta is not None
        else f"1 / (10 x its {examples} examples): a guarantee that may fail for one example "
        f"in {examples} protects none"
    )  # fmt: skip
    return (
        f"--dp-delta {delta:g} is above this site's cap {cap:g} ({why}); run with --dp-delta "
        f"{cap:g} or below"
    )
