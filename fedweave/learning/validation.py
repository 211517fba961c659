"""Is a model update fit to enter the aggregate? Pure checks: the update itself, used at the
site (before SecAgg+ masks it) and at the coordinator (on each update without SecAgg+, on the
unmasked aggregate with it); and the example count a site reports with a result, at the
coordinator."""

from __future__ import annotations

import math

import numpy as np

CHECK_CHUNK = 1 << 18
"""Values a check reads at a time (256 Ki: 2 MB of float64), so checking an update costs a few
MB beside it whatever the model's size, not a float64 copy of its largest tensor (537 MB for
the 8192 x 8192 layer of issue 36's 67.7M-parameter model) and a boolean one (67 MB)."""


def _chunks(array: np.ndarray):
    flat = array.reshape(-1)  # a view of the contiguous arrays updates arrive as
    for start in range(0, flat.size, CHECK_CHUNK):
        yield flat[start : start + CHECK_CHUNK]


def _all_finite(array: np.ndarray) -> bool:
    return all(bool(np.isfinite(part).all()) for part in _chunks(array))


def _squared_distance(got: np.ndarray, want: np.ndarray) -> float:
    """``sum((got - want)**2)`` in float64, a chunk at a time."""
    total = 0.0
    for mine, theirs in zip(_chunks(got), _chunks(want)):
        difference = mine.astype(np.float64)
        difference -= theirs
        total += float(np.dot(difference, difference))
    return total


def update_problem(
    update: list[np.ndarray], reference: list[np.ndarray], max_norm: float | None = None
) -> str | None:
    """Why ``update`` must be rejected, in one line, or ``None`` when it is acceptable.

    Args:
        update: the weights a site (or the aggregate) proposes.
        reference: the global weights the round started from; shapes and dtypes must match.
        max_norm: bound on the L2 norm of ``update - reference`` (``None``: no bound).
    """
    if len(update) != len(reference):
        return f"wrong number of tensors: {len(update)}, the model has {len(reference)}"
    for index, (got, want) in enumerate(zip(update, reference)):
        if got.shape != want.shape:
            return f"tensor {index} has shape {tuple(got.shape)}, the model has {tuple(want.shape)}"
        if got.dtype != want.dtype:
            return f"tensor {index} has dtype {got.dtype}, the model has {want.dtype}"
        if got.dtype.kind == "f" and not _all_finite(got):
            return f"tensor {index} has non-finite values (NaN or inf)"
    if max_norm is not None:
        squared = sum(
            _squared_distance(got, want)
            for got, want in zip(update, reference)
            if got.dtype.kind == "f"
        )
        norm = squared**0.5
        if norm > max_norm:
            return f"update norm {norm:.3g} exceeds the bound {max_norm:.3g}"
    return None


def clipped_fraction(weights: list[np.ndarray], scale: float, clipping_range: float) -> float:
    """Share of values SecAgg+ would clip: ``|scale * w| > clipping_range``."""
    total = sum(w.size for w in weights)
    if total == 0:
        return 0.0
    clipped = sum(
        int(np.count_nonzero(np.abs(part) * scale > clipping_range))
        for w in weights
        for part in _chunks(w)
    )
    return clipped / total


def count_problem(count: object) -> str | None:
    """Why ``count``, the number of examples a site says it trained or evaluated on, must be
    refused, in one line, or ``None``: it must be a whole number of at least 1. A count of NaN,
    a negative count cancelling the others, or zero everywhere would fail the round's
    weighted mean, and with it the run and every resume."""
    if isinstance(count, bool) or not isinstance(count, (int, float, np.integer, np.floating)):
        return f"example count of type {type(count).__name__}, not a number"
    if not math.isfinite(count) or count < 1 or count != int(count):
        return f"example count {float(count):g} is not a whole number of at least 1"
    return None
