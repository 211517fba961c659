"""Is a model update fit to enter the aggregate? Pure checks: the update itself, used at the
site (before SecAgg+ masks it) and at the coordinator (on each update without SecAgg+, on the
unmasked aggregate with it); and the example count a site reports with a result, at the
coordinator."""

from __future__ import annotations

import math

import numpy as np


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
        if got.dtype.kind == "f" and not np.isfinite(got).all():
            return f"tensor {index} has non-finite values (NaN or inf)"
    if max_norm is not None:
        squared = sum(
            float(np.sum((got.astype(np.float64) - want) ** 2))
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
    clipped = sum(int(np.count_nonzero(np.abs(w) * scale > clipping_range)) for w in weights)
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
