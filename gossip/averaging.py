"""Mixing rules for gossip, pure NumPy (no sockets, no torch): easy to test and to reason about.

Models are ``OrderedDict[str, np.ndarray]``. Only floating tensors are mixed; integer buffers
(counters such as BatchNorm's ``num_batches_tracked``) keep the local value. Functions never
modify their inputs in place: arrays handed to a zero-copy send may still be in flight.

- ``pairwise``: push-pull averaging weighted by examples. Written as a *delta against the
  snapshot that was sent* so the weighted network sum ``sum_i n_i x_i`` is preserved exactly
  even when the peer changed its model (served another offer) while waiting for the reply.
- ``clipped``: ClippedGossip (He, Karimireddy, Jaggi 2022): each neighbour's difference is
  clipped to radius ``tau`` before it is applied, and weighed by its example count capped at
  the median count of the mix (``median_capped``), so one poisoned peer moves us at most
  ``tau`` times a typical site's share per mix.
- ``trimmed``: coordinate-wise trimmed mean of self and neighbours (drop the ``b`` largest and
  smallest values of each coordinate).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np

Weights = Mapping[str, np.ndarray]
MIX_RULES = ("pairwise", "clipped", "trimmed")


def _float_keys(weights: Weights) -> list[str]:
    return [k for k, v in weights.items() if v.dtype.kind == "f"]


def pairwise_share(n_self: int, n_other: int) -> float:
    """Fraction of the way to move toward the other model; equal shares when both are 0."""
    total = n_self + n_other
    return 0.5 if total <= 0 else n_other / total


def bounded_scale(distance: float, radius: float) -> float:
    """The part of a difference of length ``distance`` an exchange takes when no move may
    span more than ``radius``: 1 within it, ``radius / distance`` beyond."""
    if not distance > radius or distance <= 0:
        return 1.0
    return radius / distance


def pairwise_update(
    current: Weights,
    sent: Weights,
    other: Weights,
    n_self: int,
    n_other: int,
    share: float | None = None,
) -> OrderedDict[str, np.ndarray]:
    """``current + n_other/(n_self+n_other) * (other - sent)`` for floating tensors.

    Both ends apply it (the replier with ``sent == current``), so after the exchange both
    equal the example-weighted average of what they swapped and ``n_a x_a + n_b x_b`` is
    unchanged: the network average is preserved. ``share`` overrides the fraction (a group
    exchange with ``N`` examples in all: neighbours move ``n_offerer / N``, the offerer moves
    ``n_j / N`` per reply; PROTOCOL.md §5).
    """
    if share is None:
        share = pairwise_share(n_self, n_other)
    out: OrderedDict[str, np.ndarray] = OrderedDict()
    floats = set(_float_keys(current))
    for key, value in current.items():
        if key in floats:
            delta = other[key].astype(np.float64) - sent[key].astype(np.float64)
            out[key] = (value.astype(np.float64) + share * delta).astype(value.dtype)
        else:
            out[key] = value
    return out


def difference_norm(a: Weights, b: Weights) -> float:
    """Global L2 norm of ``a - b`` over all floating tensors."""
    total = 0.0
    for key in _float_keys(a):
        diff = a[key].astype(np.float64) - b[key].astype(np.float64)
        total += float(np.dot(diff.ravel(), diff.ravel()))
    return math.sqrt(total)


def adaptive_tau(norms: Sequence[float], history: Sequence[float] = ()) -> float:
    """Clipping radius when none is given: the median of the recent difference norms.

    Honest neighbours are the majority, so the median tracks their spread while a poisoned
    difference (far larger) is cut down to it.
    """
    pool = [n for n in (*history, *norms) if math.isfinite(n)]
    return float(np.median(pool)) if pool else 0.0


def median_capped(counts: Sequence[int]) -> list[float]:
    """Mixing weights from example counts, each at most the median of them all.

    A claimed count is what a poisoned peer inflates; capped at the median it weighs no more
    than a typical member of the mix while honest peers are the majority, and honest sites of
    unequal size below the median keep their proportions. Against ``pairwise`` on mnist5k's
    Dirichlet peers, equal weights (which a cap at the smallest count would give) cost 1.8
    points, this cap 0.9 (``docs/benchmarks.md``). All zero: equal weights.
    """
    cap = float(np.median(counts)) if len(counts) else 0.0
    capped = [min(max(float(c), 0.0), cap) for c in counts]
    total = sum(capped)
    if total <= 0:
        return [1.0 / len(counts)] * len(counts) if counts else []
    return [c / total for c in capped]


def clipped_update(
    current: Weights,
    neighbours: Sequence[Weights],
    tau: float,
    counts: Sequence[int] | None = None,
) -> OrderedDict[str, np.ndarray]:
    """ClippedGossip: ``x + sum_j w_j clip(x_j - x, tau)`` over ``k`` neighbours.

    ``counts``: our example count, then each neighbour's (as counted, ``guard``); the weights
    ``w`` are ``median_capped(counts)`` (ours is the share we keep). ``None``: equal weights,
    ``1 / (k + 1)``.
    """
    if not neighbours:
        return OrderedDict(current)
    if counts is None:
        shares = [1.0 / (len(neighbours) + 1)] * len(neighbours)
    else:
        if len(counts) != len(neighbours) + 1:
            raise ValueError("counts: ours, then one per neighbour")
        shares = median_capped(counts)[1:]
    floats = _float_keys(current)
    acc = {k: current[k].astype(np.float64) for k in floats}
    for share, other in zip(shares, neighbours):
        norm = difference_norm(other, current)
        scale = 1.0 if norm <= tau or norm == 0.0 else tau / norm
        for key in floats:
            diff = other[key].astype(np.float64) - current[key].astype(np.float64)
            acc[key] += share * scale * diff
    return OrderedDict((k, acc[k].astype(v.dtype) if k in acc else v) for k, v in current.items())


def trimmed_mean(
    current: Weights, neighbours: Sequence[Weights], trim_fraction: float = 0.2
) -> OrderedDict[str, np.ndarray]:
    """Coordinate-wise trimmed mean of ``current`` and ``neighbours`` (unweighted: robust
    statistics cannot trust a claimed example count).

    ``b = floor(trim_fraction * m)`` values are dropped at each end of ``m`` models, at least 1
    (so self + 2 neighbours gives the coordinate-wise median). With fewer than 3 models
    nothing can be trimmed, and averaging with a lone neighbour would let a poisoned one in
    (then the contamination spreads), so the local model is kept unchanged.
    """
    models = [current, *neighbours]
    m = len(models)
    if m < 3:
        return OrderedDict(current)
    b = min(max(1, int(math.floor(trim_fraction * m))), (m - 1) // 2)
    out: OrderedDict[str, np.ndarray] = OrderedDict()
    floats = set(_float_keys(current))
    for key, value in current.items():
        if key not in floats:
            out[key] = value
            continue
        stack = np.stack([np.asarray(w[key], dtype=np.float64) for w in models])
        if b > 0:
            stack = np.sort(stack, axis=0)[b : m - b]
        out[key] = stack.mean(axis=0).astype(value.dtype)
    return out


def flatten(weights: Weights) -> np.ndarray:
    """All floating tensors as one float64 vector (for consensus distance)."""
    keys = _float_keys(weights)
    if not keys:
        return np.zeros(0)
    return np.concatenate([np.asarray(weights[k], dtype=np.float64).ravel() for k in keys])


def consensus_distance(vectors: Sequence[np.ndarray]) -> float:
    """Mean L2 distance of each peer's flattened model to the peers' mean model."""
    if not vectors:
        return 0.0
    stack = np.stack(vectors)
    mean = stack.mean(axis=0)
    return float(np.linalg.norm(stack - mean, axis=1).mean())
