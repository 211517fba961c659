"""A site's evaluation part: the examples it scores the global model on, never trained on.

Either the site's own file (``--eval-data``), or a share of its ``--data`` held out
(``--eval-fraction``): the same examples every round and every restart, chosen by a seeded
permutation of the example indices, so a site never evaluates on what it trained on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

HOLDOUT_SEED = 20_211
"""Fixed: the held-out examples depend on the site's data only, not on the run."""


def subset(data: Any, indices: np.ndarray) -> Any:
    """``data`` restricted to ``indices``: its own ``subset`` (``ArrayData``, tables), or a
    ``torch.utils.data.Subset`` of any other ``Dataset`` (nothing is loaded)."""
    if hasattr(data, "subset"):
        return data.subset(indices)
    from torch.utils.data import Subset

    return Subset(data, indices.tolist())


def hold_out(data: Any, fraction: float) -> tuple[Any, Any | None]:
    """(training part, evaluation part) of a site's data; the evaluation part is
    ``fraction`` of the examples (at least one, and one is always left to train on), or
    ``None`` when ``fraction`` is 0 or the site holds fewer than two examples."""
    split = held_out_indices(len(data), fraction)
    if split is None:
        return data, None
    kept, held = split
    return subset(data, kept), subset(data, held)


def held_out_indices(n: int, fraction: float) -> tuple[np.ndarray, np.ndarray] | None:
    """(indices trained on, indices held out) of ``n`` examples, both sorted; ``None`` when
    nothing is held out (``fraction`` 0, or fewer than two examples)."""
    if fraction <= 0 or n < 2:
        return None
    held = min(max(int(round(fraction * n)), 1), n - 1)
    order = np.random.default_rng(HOLDOUT_SEED).permutation(n)
    return np.sort(order[held:]), np.sort(order[:held])
