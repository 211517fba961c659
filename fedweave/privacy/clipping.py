"""Clipping an update to an L2 norm: the bound every DP mechanism's sensitivity rests on."""

from __future__ import annotations

import math

import numpy as np


def update_norm(weights: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """The L2 norm of ``weights - reference`` over every tensor together."""
    return math.sqrt(
        sum(float(np.sum((w.astype(np.float64) - r) ** 2)) for w, r in zip(weights, reference))
    )


def clipped(
    weights: list[np.ndarray], reference: list[np.ndarray], clipping_norm: float
) -> list[np.ndarray]:
    """``weights`` moved towards ``reference`` until their update has L2 norm at most
    ``clipping_norm`` (new arrays, in the weights' dtypes; an update within it is kept)."""
    norm = update_norm(weights, reference)
    factor = 1.0 if norm <= clipping_norm else clipping_norm / norm
    if factor == 1.0:
        return [np.array(w, copy=True) for w in weights]
    return [
        (r.astype(np.float64) + (w.astype(np.float64) - r) * factor).astype(w.dtype)
        for w, r in zip(weights, reference, strict=True)
    ]
