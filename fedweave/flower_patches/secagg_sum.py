"""SecAgg+'s sum of masked vectors and its unmasking, a part at a time and in place, with
fedweave's masks (issue 36).

Flower 1.41's SecAgg+ workflow holds every site's masked vector at once (its collect stage
pulls all the replies, then adds them up with ``parameters_addition``, a new vector each
time), unmasks by generating each mask whole and subtracting it into a new vector, and
dequantizes into float64 vectors (twice the model's float32 bytes) that it then serialises.
On the 67.7M-parameter MLP of ``bench_large_model.py`` that made the coordinator's ServerApp
peak at about twelve models.

Here, where the masks are fedweave's (modulus 2^32, ``secagg_masks``: one AES-CTR keystream
per seed, read as uint32):

- the masked vectors are added into one uint32 vector, ``SUM_CHUNK`` values of one site at
  a time (``masked_sum``), each site's vector read from its reply or its spool file
  (``fedweave/bulk/array_parts.py``);
- each mask is generated a part at a time from its place in the keystream and added or
  subtracted in place (``add_keystream``); uint32 wrap-around is the modulo;
- the dequantized mean is written a part at a time into the ``.npy`` bytes Flower's
  ``ndarrays_to_parameters`` would make (``unmasked_tensors``), and each part of the sum it
  was read from is given back to the system as soon as it is written (the sum lives in
  anonymous memory maps, ``_zeros``), so the sum and the mean's bytes take one model's
  memory between them, not two: in Flower's own layout (the
  vector's shapes, float64), or in the global model's shapes and dtypes where the caller asks
  for them, which is what the coordinator's reporting strategy made of Flower's layout
  anyway (``secagg_masks.unflatten``, then a cast to the model's dtype).

Every value equals Flower's: sums and differences of integers agree modulo 2^32 whatever the
order and width they are taken in, and each value is dequantized with the same float64
operations in the same order before its one cast. ``tests/test_secagg_sum.py`` checks this
against Flower's own stages.
"""

from __future__ import annotations

import io
import math
import mmap
from collections.abc import Iterator, Sequence

import numpy as np

from fedweave.bulk.array_parts import UpdateSource
from fedweave.bulk.records import write_npy_header
from fedweave.flower_patches.secagg_masks import FAST_MODULUS, keystream_part

SUM_CHUNK = 1 << 20
"""Values of one array handled at a time (4 MB of uint32, 8 MB once dequantized)."""


def streams(mod_range: int) -> bool:
    """Whether SecAgg+ with this modulus can be summed and unmasked here: fedweave's masks
    are installed in Flower's workflow and the modulus is theirs (2^32)."""
    import importlib

    from fedweave.flower_patches import secagg_masks

    workflow = importlib.import_module(
        "flwr.server.workflow.secure_aggregation.secaggplus_workflow"
    )
    prg = workflow.pseudo_rand_gen
    return mod_range == FAST_MODULUS and getattr(prg, "__module__", "") == secagg_masks.__name__


class _SumPages(mmap.mmap):
    """The anonymous memory a SecAgg+ sum is kept in (``_zeros``)."""


def _zeros(shape: tuple[int, ...]) -> np.ndarray:
    """A uint32 array of zeros in an anonymous memory map of its own, whose pages
    ``_release`` can give back to the system one part at a time (memory that ``free`` returns
    is not reliably given back). The kernel fills the pages with zeros as they are touched;
    the map is private, so that a page given back is freed (a shared one would be kept)."""
    count = math.prod(shape)
    if count == 0:
        return np.zeros(shape, np.uint32)
    mapping = _SumPages(-1, count * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(mapping, np.uint32, count).reshape(shape)


def _mapping(array: np.ndarray) -> _SumPages | None:
    """The memory ``array`` starts at, if ``_zeros`` made it."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer's
        base = base.obj
    if isinstance(base, _SumPages) and array.ctypes.data == (
        np.frombuffer(base, np.uint8, 1).ctypes.data
    ):
        return base
    return None


def _release(flat: np.ndarray, start: int, stop: int) -> None:
    """Give back to the system the pages that values ``start`` to ``stop`` of ``flat`` (a
    ``_zeros`` array, read for the last time) lie wholly in; they read as zeros after. A
    no-op for any other array."""
    mapping = _mapping(flat)
    if mapping is None:
        return
    page = mmap.PAGESIZE
    first = -(-start * flat.itemsize // page) * page
    last = stop * flat.itemsize // page * page
    if last > first:
        mapping.madvise(mmap.MADV_DONTNEED, first, last - first)


def _flat(array: np.ndarray) -> np.ndarray:
    flat = array.reshape(-1)
    if not np.shares_memory(flat, array):
        raise ValueError("a SecAgg+ sum must be C-contiguous to be changed in place")
    return flat


def add_keystream(vector: Sequence[np.ndarray], seed: bytes, subtract: bool) -> None:
    """Add (or subtract) the mask ``pseudo_rand_gen(seed, 2**32, shapes of vector)`` to the
    uint32 arrays of ``vector``, in place, ``SUM_CHUNK`` values at a time."""
    offset = 0  # the mask is one keystream over the arrays, in order
    for array in vector:
        flat = _flat(array)
        for start in range(0, flat.size, SUM_CHUNK):
            stop = min(flat.size, start + SUM_CHUNK)
            mask = keystream_part(seed, offset + start, stop - start)
            part = flat[start:stop]
            if subtract:
                np.subtract(part, mask, out=part)
            else:
                np.add(part, mask, out=part)
        offset += flat.size


def masked_sum(total: list[np.ndarray] | None, vector: UpdateSource) -> list[np.ndarray]:
    """``total`` (None: zeros) plus one site's masked ``vector``, modulo 2^32, as uint32
    arrays of the vector's shapes. ``ValueError`` where its shapes are not ``total``'s."""
    layers = [vector.layer(index) for index in range(vector.layers)]
    shapes = [tuple(layer.shape) for layer in layers]
    if total is None:
        total = [_zeros(shape) for shape in shapes]
    if shapes != [array.shape for array in total]:
        raise ValueError(f"a masked vector of shapes {shapes} cannot be added to the sum's")
    for array, layer in zip(total, layers):
        if layer.dtype.kind not in "iu":
            raise ValueError(f"a masked vector of dtype {layer.dtype}, not integers")
        flat = _flat(array)
        for start in range(0, flat.size, SUM_CHUNK):
            stop = min(flat.size, start + SUM_CHUNK)
            part = flat[start:stop]
            # any integer's value modulo 2^32 (C's conversion), as Flower's final modulo
            np.add(part, layer.values(start, stop).astype(np.uint32, copy=False), out=part)
    return total


def as_sum(vector: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Flower's summed vector (``state.aggregate_ndarrays``, its integers of any width) as the
    writable, C-ordered uint32 arrays ``add_keystream`` works in (values modulo 2^32): the
    arrays themselves where they are that already (``masked_sum``'s)."""
    arrays = [np.ascontiguousarray(array).astype(np.uint32, copy=False) for array in vector]
    return [array if array.flags.writeable else array.copy() for array in arrays]


def _npy_bytes(parts: Iterator[np.ndarray], dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` bytes of an array of ``dtype`` and ``shape`` whose values, in C order,
    are ``parts`` (fresh contiguous arrays), written one after the other."""
    buffer = io.BytesIO()
    write_npy_header(buffer, dtype, shape)
    for part in parts:
        buffer.write(memoryview(part).cast("B"))
    return buffer.getvalue()


def unmasked_tensors(
    vector: list[np.ndarray],
    *,
    clipping_range: float,
    quantization_range: int,
    active_sites: int,
    like: Sequence[tuple[tuple[int, ...], np.dtype]] | None = None,
) -> list[bytes]:
    """The dequantized weighted mean in the unmasked, summed ``vector`` (its first array's
    first value the sum of the sites' quantized weights, the rest the weights), as the
    ``.npy`` bytes of Flower's ``unmask_stage``: arrays of the vector's shapes in float64;
    or, given ``like`` (the global model's shapes and dtypes, whose sizes add up to the
    vector's), arrays of those shapes and dtypes, each value cast once from Flower's (what
    ``secagg_masks.unflatten`` and the reporting strategy's cast made of Flower's).

    The weights are read once, in order, and each part read is given back to the system
    (``_release``) where the vector is ``masked_sum``'s: the vector is used up."""
    q_total_ratio = vector[0][0]  # Flower's factor_extract
    weights = vector[1:]
    inv_dq_total_ratio = quantization_range / q_total_ratio
    quantizer = (2 * clipping_range) / quantization_range
    shift = -clipping_range
    offset = -(active_sites - 1) * clipping_range

    def dequantized(values: np.ndarray) -> np.ndarray:
        recon = values.astype(float)  # Flower's dequantize, then its offset and scaling
        recon = recon * quantizer + shift
        recon += offset
        recon *= inv_dq_total_ratio
        return recon

    total = sum(array.size for array in weights)
    if like is None or sum(math.prod(shape) for shape, _ in like) != total:
        tensors = []
        for array in weights:
            flat = _flat(array)

            def parts(flat: np.ndarray = flat) -> Iterator[np.ndarray]:
                for start in range(0, flat.size, SUM_CHUNK):
                    stop = min(flat.size, start + SUM_CHUNK)
                    yield dequantized(flat[start:stop])
                    _release(flat, start, stop)

            tensors.append(_npy_bytes(parts(), np.dtype(np.float64), array.shape))
        return tensors
    flats = [_flat(array) for array in weights]

    def mean_part(start: int, stop: int) -> np.ndarray:
        """Flower's dequantized values ``start`` to ``stop`` of the weights, counted across
        their arrays; the parts read are then released."""
        pieces, begin = [], 0
        for flat in flats:
            end = begin + flat.size
            if start < end and stop > begin:
                pieces.append((flat, max(start, begin) - begin, min(stop, end) - begin))
            begin = end
        read = [flat[first:last] for flat, first, last in pieces]
        out = dequantized(read[0] if len(read) == 1 else np.concatenate(read))
        for flat, first, last in pieces:
            _release(flat, first, last)
        return out

    tensors, begin = [], 0
    for shape, dtype in like:
        count = math.prod(shape)
        parts = (
            mean_part(begin + start, begin + min(count, start + SUM_CHUNK)).astype(dtype)
            for start in range(0, count, SUM_CHUNK)
        )
        tensors.append(_npy_bytes(parts, np.dtype(dtype), tuple(shape)))
        begin += count
    return tensors
