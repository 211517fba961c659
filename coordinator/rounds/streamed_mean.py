"""FedAvg's weighted mean of a round's updates, a part of every update at a time: the
coordinator holds the mean's serialised bytes and a few MB beside them, not the mean and its
bytes both (issue 36).

Flower's ``aggregate_inplace`` scales each update by its share of the examples and adds the
updates up in order, then the mean is serialised (``ndarray_to_bytes``). Here every array
of the mean is written straight into its ``.npy`` bytes, ``MEAN_CHUNK`` values at a time: for
each part, each site's values are read (from its update's file in the transfer spool, at the
offset its header gives), scaled and added in the same order, with the same operations, so
every value is bit for bit Flower's.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import numpy as np

from fedweave.bulk.array_parts import UpdateSource
from fedweave.bulk.records import write_npy_header

MEAN_CHUNK = 1 << 20
"""Values of one array read from each update at a time (4 MB of float32)."""


def scaled_in_place(x: np.ndarray, factor: np.float64) -> np.ndarray:
    """``x`` times ``factor``, in place, as Flower's ``aggregate_inplace`` scales an update
    (a factor that does not cast to ``x``'s kind is cast to its dtype first)."""
    if not x.flags.writeable:
        x = x.copy()
    if np.can_cast(factor, x.dtype, casting="same_kind"):
        return np.multiply(x, factor, out=x)
    return np.multiply(x, np.array(factor, x.dtype), out=x)


def mean_tensors(
    sources: Sequence[UpdateSource],
    factors: Sequence[np.float64],
    layers: int,
) -> list[bytes]:
    """The weighted mean of ``sources`` (each scaled by its factor, added in order), each of
    its ``layers`` arrays as the ``.npy`` bytes Flower's ``ndarray_to_bytes`` makes of it.
    Every source's arrays must have the first source's dtypes and shapes (the round's checks
    saw to it)."""
    tensors = []
    for index in range(layers):
        parts = [source.layer(index) for source in sources]
        dtype, shape = parts[0].dtype, parts[0].shape
        if any(part.dtype != dtype or part.shape != shape for part in parts):
            raise ValueError(f"array {index} differs in dtype or shape between the updates")
        buffer = io.BytesIO()
        write_npy_header(buffer, dtype, shape)
        count = math.prod(shape)
        for start in range(0, count, MEAN_CHUNK):
            stop = min(count, start + MEAN_CHUNK)
            total = None
            for part, factor in zip(parts, factors):
                scaled = scaled_in_place(part.values(start, stop), factor)
                total = scaled if total is None else np.add(total, scaled, out=total)
            buffer.write(memoryview(total).cast("B"))  # a fresh, contiguous array
        tensors.append(buffer.getvalue())
        del buffer, parts
    return tensors
