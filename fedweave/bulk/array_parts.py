"""An update's arrays read a part at a time, from memory or from its blob file in the transfer
spool, so that a sum over many sites' updates holds one part of each at a time, not every
update (issue 36): FedAvg's mean (``coordinator/rounds/streamed_mean.py``) and SecAgg+'s sum of
masked vectors (``fedweave/flower_patches/secagg_sum.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from fedweave.bulk.records import read_values


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
        place = self._places[index]
        if not place.fortran:
            return _FileValues(self._file, place)
        whole = read_values(self._file, place, 0, place.count)
        return _ArrayValues(whole.reshape(place.shape, order="F"))

    def close(self) -> None:
        self._file.close()
