"""FedAvg's mean a part of every update at a time (``coordinator/rounds/streamed_mean.py``,
issue 36): bit for bit the mean Flower's ``aggregate_inplace`` takes of the same updates in
memory, whatever the parts' size, from update files in the transfer spool's format (arrays in
C or Fortran order) and from updates in memory; and it holds the mean's bytes, not the mean
beside them."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord
from flwr.common import Code as StatusCode
from flwr.common import FitRes, Parameters, Status, ndarray_to_bytes, ndarrays_to_parameters
from flwr.server.strategy.aggregate import aggregate_inplace

from fedweave.bulk.array_parts import HeldUpdate, UpdateInMemory
from fedweave.bulk.records import encoded, npy_places_file
from fedweave.coordinator.rounds import streamed_mean
from fedweave.coordinator.rounds.streamed_mean import mean_tensors

RECORD = "fitres.parameters"


def _blob(path, arrays) -> HeldUpdate:
    record = ArrayRecord(array_dict={
        str(i): Array(dtype=str(a.dtype), shape=a.shape, stype="numpy.ndarray",
                      data=ndarray_to_bytes(a))
        for i, a in enumerate(arrays)
    })  # fmt: skip
    path.write_bytes(encoded({RECORD: record}))
    return HeldUpdate(path, npy_places_file(path, RECORD))


def _update(rng: np.random.Generator) -> list[np.ndarray]:
    return [
        rng.standard_normal((37, 53)).astype(np.float32),
        np.asfortranarray(rng.standard_normal((11, 7)).astype(np.float32)),
        np.array(rng.standard_normal(), dtype=np.float32),  # a 0-d array
        np.zeros((0, 3), np.float32),
        rng.integers(0, 5, size=9).astype(np.int64),  # a counter: the factor cast to it
    ]


@pytest.mark.parametrize("chunk", [1, 64, 1000, 1 << 20])
def test_the_mean_a_part_at_a_time_is_flowers_mean_bit_for_bit(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(streamed_mean, "MEAN_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    updates = [_update(rng) for _ in range(4)]
    counts = [10, 35, 1, 10**6]
    expected = aggregate_inplace([
        (None, FitRes(Status(StatusCode.OK, ""), ndarrays_to_parameters(u), n, {}))
        for u, n in zip(updates, counts)
    ])  # fmt: skip
    factors = np.asarray([n / sum(counts) for n in counts])
    sources = [_blob(tmp_path / f"site{i}.blob", u) for i, u in enumerate(updates[:3])]
    sources.append(UpdateInMemory([a.copy(order="K") for a in updates[3]]))
    try:
        tensors = mean_tensors(sources, factors, len(updates[0]))
    finally:
        for source in sources:
            source.close()
    from flwr.common import parameters_to_ndarrays

    got = parameters_to_ndarrays(Parameters(tensors, "numpy.ndarray"))
    for mine, flowers in zip(got, expected, strict=True):
        assert mine.dtype == flowers.dtype and mine.shape == flowers.shape
        assert mine.tobytes(order="C") == np.ascontiguousarray(flowers).tobytes()
    # a C-ordered array's bytes are np.save's own
    assert tensors[0] == ndarray_to_bytes(np.ascontiguousarray(expected[0]))
    mismatched = [UpdateInMemory(updates[0]), UpdateInMemory([updates[1][0].T, *updates[1][1:]])]
    with pytest.raises(ValueError, match="array 0 differs in dtype or shape"):
        mean_tensors(mismatched, factors[:2], len(updates[0]))


def test_the_mean_of_large_updates_holds_its_bytes_and_a_few_parts(tmp_path):
    rng = np.random.default_rng(0)
    size = 8 * streamed_mean.MEAN_CHUNK  # 32 MB of float32 an update
    sources = [_blob(tmp_path / f"site{i}.blob", [rng.standard_normal(size, np.float32)])
               for i in range(3)]  # fmt: skip
    tracemalloc.start()  # numpy reports its buffers to it
    try:
        (tensor,) = mean_tensors(sources, np.asarray([0.5, 0.25, 0.25]), 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        for source in sources:
            source.close()
    model = size * 4
    assert len(tensor) > model
    # the mean's bytes (with the buffer's growth) and one part from each site: not the mean
    # and its bytes both (2 models)
    assert peak < 1.3 * model + 4 * streamed_mean.MEAN_CHUNK * 4, peak / model
