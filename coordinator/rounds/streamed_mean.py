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
from pathlib import Path
from typing import Protocol

import numpy as np

MEAN_CHUNK = 1 << 20
"""Values of one array read from each update at a time (4 MB of float32)."""


class LayerValues(Protocol):
    """One array of one update: its dtype and shape, and its values in C order by range."""

    dtype: np.dtype
    shape: tuple[int, ...]

    def values(self, start: int, stop: int) -> np.ndarray:
        """Values ``start`` to ``stop`` (C order, flat) in a fresh, writable array."""
        ...


class UpdateSource(Protocol):
    """One site's update, an array at a time (``HeldUpdate``, ``UpdateInMemory``)."""

    layers: int

    def layer(self, index: int) -> LayerValues: ...

    def close(self) -> None: ...


class _ArrayValues:
    def __init__(self, array: np.ndarray) -> None:
        self.dtype, self.shape = array.dtype, tuple(array.shape)
        self._flat = np.ravel(array, order="C")  # a view of a C-ordered array

    def values(self, start: int, stop: int) -> np.ndarray:
        return np.array(self._flat[start:stop])


class UpdateInMemory:
    """An update already read (decoded, or held in its reply)."""

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        self._arrays = arrays
        self.layers = len(arrays)

    def layer(self, index: int) -> LayerValues:
        return _ArrayValues(self._arrays[index])

    def close(self) -> None:
        pass


class _FileValues:
    def __init__(self, file, place) -> None:
        self._file, self._place = file, place
        self.dtype, self.shape = place.dtype, tuple(place.shape)

    def values(self, start: int, stop: int) -> np.ndarray:
        from fedweave.bulk.records import read_values

        return read_values(self._file, self._place, start, stop - start)


class HeldUpdate:
    """An update in its file in the transfer spool (``SpooledUpdates.places``): each array
    read a part at a time where its values are stored in C order, whole where a site stored
    them in Fortran order."""

    def __init__(self, path: Path, places: list) -> None:
        self._places = places
        self.layers = len(places)
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()

    def layer(self, index: int) -> LayerValues:
        from fedweave.bulk.records import read_values

        place = self._places[index]
        if not place.fortran:
            return _FileValues(self._file, place)
        whole = read_values(self._file, place, 0, place.count)
        return _ArrayValues(whole.reshape(place.shape, order="F"))

    def close(self) -> None:
        self._file.close()


def scaled_in_place(x: np.ndarray, factor: np.float64) -> np.ndarray:
    """``x`` times ``factor``, in place, as Flower's ``aggregate_inplace`` scales an update
    (a factor that does not cast to ``x``'s kind is cast to its dtype first)."""
    if not x.flags.writeable:
        x = x.copy()
    if np.can_cast(factor, x.dtype, casting="same_kind"):
        return np.multiply(x, factor, out=x)
    return np.multiply(x, np.array(factor, x.dtype), out=x)


def _npy_header(buffer: io.BytesIO, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """The header ``np.save`` writes for a C-ordered array of ``dtype`` and ``shape``."""
    from numpy.lib import format as npy

    header = {"descr": npy.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    try:
        npy.write_array_header_1_0(buffer, header)
    except ValueError:  # a header too long for version 1.0, as np.save falls back
        buffer.seek(0)
        buffer.truncate()
        npy.write_array_header_2_0(buffer, header)


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
        _npy_header(buffer, dtype, shape)
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
