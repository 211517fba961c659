"""A message's array records as one safetensors blob, and back.

Each ``Array`` travels as the bytes Flower would have sent (its ``data``, NumPy's serialisation
for the arrays fedweave sends) in a uint8 tensor; the safetensors metadata says which record
and key each tensor belongs to, with the array's dtype, shape and stype, in order. The bytes
are read back exactly, so what a workflow receives is what the site's code returned, and
Flower's own readers (``allow_pickle=False``) parse them as before. safetensors bounds its
header and checks every offset; ``decoded`` checks the metadata it reads.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

LAYOUT_KEY = "fedweave.records"
"""safetensors metadata: JSON list of ``[record, key, dtype, shape, stype]``, tensor ``i`` being
the ``i``-th entry's bytes."""
MAX_NPY_HEADER = 1 << 16
"""The most bytes of an array's ``.npy`` header read (NumPy's own reader refuses past 10,000
by default)."""
MAX_HEADER = 100 << 20
"""The longest safetensors header read (safetensors' own limit)."""
MAX_ARRAYS = 1_000_000
"""The most arrays one blob may name (a model's tensors are thousands at most)."""


class BlobError(ValueError):
    """A blob that is not one this module wrote: the reason, in one line."""


def encoded(records: dict[str, Any]) -> bytes:
    """``records`` (array record name → ``ArrayRecord``) as one safetensors blob."""
    return b"".join(encoded_parts(records))


def encoded_parts(records: dict[str, Any]) -> list[bytes]:
    """``encoded``'s blob as its pieces, in order: the header's length, the header, then each
    array's bytes themselves. Written or sent piece by piece, a blob costs no copy of the
    model (safetensors' own writer copies every tensor, then the whole blob, before writing
    a byte); ``safe_open`` and ``safetensors.numpy.load`` read it as any safetensors file."""
    header: dict[str, Any] = {}
    layout, parts, offset = [], [], 0
    for name, record in records.items():
        for key, array in record.items():
            size = len(array.data)
            header[str(len(layout))] = {
                "dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size],
            }  # fmt: skip
            layout.append([name, key, array.dtype, list(array.shape), array.stype])
            parts.append(array.data)
            offset += size
    header["__metadata__"] = {LAYOUT_KEY: json.dumps(layout)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors' own writer aligns the data to 8 bytes
    return [len(text).to_bytes(8, "little"), text, *parts]


def digest(blob: bytes | memoryview) -> str:
    """The sha256 hex digest a blob is named by."""
    return hashlib.sha256(blob).hexdigest()


def decoded(blob: bytes) -> dict[str, Any]:
    """The array records ``encoded`` wrote into ``blob``, in their order; ``BlobError`` for
    anything else."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    if len(blob) < 8:
        raise BlobError("shorter than a safetensors header")
    size = int.from_bytes(blob[:8], "little")
    if size > min(len(blob) - 8, MAX_HEADER):
        raise BlobError("its header runs past its end")
    try:
        metadata = json.loads(bytes(blob[8 : 8 + size]))["__metadata__"]
        tensors = load(blob)
    except (SafetensorError, ValueError, KeyError, TypeError) as exc:
        raise BlobError(f"not a fedweave safetensors blob ({type(exc).__name__})") from None
    layout = _layout(metadata)
    if set(tensors) != {str(i) for i in range(len(layout))}:
        raise BlobError("its tensors do not match its layout")
    return _records(layout, tensors.pop)


def decoded_stream(read: Callable[[int], bytes], size: int) -> dict[str, Any]:
    """``decoded`` for a blob of ``size`` bytes read from a stream (``read(n)``: its next
    ``n`` bytes, exactly), straight into the records, one array's bytes at a time: nothing of
    the blob is held beside them. Every check ``decoded`` makes is made (the layout, and the
    safetensors header: byte-string tensors whose offsets cover the data exactly, in order);
    ``BlobError`` otherwise, before any array is read past a bad header."""
    if size < 8:
        raise BlobError("shorter than a safetensors header")
    length = int.from_bytes(read(8), "little")
    if length > min(size - 8, MAX_HEADER):
        raise BlobError("its header runs past its end")
    try:
        header = json.loads(read(length))
        layout = _layout(header.pop("__metadata__"))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise BlobError("not a fedweave safetensors blob (its header)") from None
    if set(header) != {str(i) for i in range(len(layout))}:
        raise BlobError("its tensors do not match its layout")
    spans = []
    for name, entry in header.items():
        try:
            begin, end = entry["data_offsets"]
            shape, dtype = entry["shape"], entry["dtype"]
        except (KeyError, TypeError, ValueError):
            raise BlobError(f"tensor {name}'s header is malformed") from None
        if dtype != "U8" or not isinstance(shape, list) or len(shape) != 1:
            raise BlobError(f"tensor {name} is not a byte string")
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (begin, end, *shape)):
            raise BlobError(f"tensor {name}'s offsets are not integers")
        if end - begin != shape[0] or begin < 0:
            raise BlobError(f"tensor {name}'s offsets do not match its size")
        spans.append((begin, end, name))
    spans.sort()
    at, data = 0, {}
    for begin, end, name in spans:
        if begin != at:
            raise BlobError("its tensors do not cover its data exactly")
        data[name], at = read(end - begin), end
    if 8 + length + at != size:
        raise BlobError("its tensors do not cover its data exactly")
    return _records(layout, data.pop)


def decoded_file(path: Path, leave: str | None = None) -> dict[str, Any]:
    """``decoded`` for a blob in a file, read one tensor at a time: the records and the
    tensor being read are all that is held at once. Record ``leave`` is left in the file
    (not read, not returned)."""
    layout, _sizes = layout_file(path)
    try:
        with _TensorFile(path) as tensors:
            return _records(layout, tensors.read, leave)
    except (ValueError, TypeError, OSError) as exc:
        if isinstance(exc, BlobError):
            raise
        raise BlobError(f"not a fedweave safetensors blob ({type(exc).__name__})") from None


def layout_file(path: Path) -> tuple[list[tuple[str, str, str, list[int], str]], list[int]]:
    """The checked layout of the blob in ``path`` (each entry ``(record, key, dtype, shape,
    stype)``) and each array's size in bytes, its tensors checked to be byte strings from the
    header alone: nothing of the arrays is read. ``BlobError`` for anything ``decoded`` would
    refuse there."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as blob:
            layout, names = _layout(blob.metadata()), set(blob.keys())
            if names != {str(i) for i in range(len(layout))}:
                raise BlobError("its tensors do not match its layout")
            sizes = []
            for i in range(len(layout)):
                one = blob.get_slice(str(i))
                if one.get_dtype() != "U8" or len(one.get_shape()) != 1:
                    raise BlobError(f"tensor {i} is not a byte string")
                sizes.append(int(one.get_shape()[0]))
            return layout, sizes
    except (SafetensorError, ValueError, TypeError, OSError) as exc:
        if isinstance(exc, BlobError):
            raise
        raise BlobError(f"not a fedweave safetensors blob ({type(exc).__name__})") from None


class _TensorFile:
    """The tensors of a blob file whose header safetensors has checked (``layout_file``), each
    read into a fresh array with plain reads: a memory map would count every page read into
    the process's resident memory a second time, beside the copy."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 - closed by __exit__
        try:
            size = int.from_bytes(self._file.read(8), "little")
            self._offsets = json.loads(self._file.read(size))
            self._base = 8 + size
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> _TensorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def span(self, name: str) -> tuple[int, int]:
        """Where tensor ``name``'s bytes start and end in the file."""
        begin, end = self._offsets[name]["data_offsets"]
        return self._base + begin, self._base + end

    def read_at(self, begin: int, size: int) -> bytes:
        """``size`` bytes of the file from byte ``begin``."""
        self._file.seek(begin)
        data = self._file.read(size)
        if len(data) != size:
            raise BlobError("the blob ends before its tensors do")
        return data

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name``'s bytes, as a uint8 array of its own."""
        begin, end = self._offsets[name]["data_offsets"]
        raw = np.empty(end - begin, np.uint8)
        self._file.seek(self._base + begin)
        if self._file.readinto(memoryview(raw)) != end - begin:
            raise BlobError("the blob ends before its tensors do")
        return raw


def arrays_file(path: Path, record: str) -> Iterator[np.ndarray]:
    """The bytes of each array of ``record`` in the blob in ``path`` (what the message's
    ``Array.data`` would have been), in order, one at a time, as uint8 tensors."""
    layout, _sizes = layout_file(path)
    try:
        with _TensorFile(path) as tensors:
            for i, entry in enumerate(layout):
                if entry[0] == record:
                    yield tensors.read(str(i))
    except (ValueError, TypeError, KeyError, OSError) as exc:
        if isinstance(exc, BlobError):
            raise
        raise BlobError(f"not a fedweave safetensors blob ({type(exc).__name__})") from None


def ndarrays_file(path: Path, record: str) -> Iterator[np.ndarray]:
    """The arrays of ``record`` in the blob in ``path``, in order, one at a time: each array's
    bytes (NumPy's serialisation, as Flower's ``parameters_to_ndarrays`` reads them, without
    pickles) parsed in place, so one array is held per step. ``BlobError`` for bytes that are
    not such an array."""
    for raw in arrays_file(path, record):
        yield npy_array(raw)


def npy_array(raw: np.ndarray) -> np.ndarray:
    """The array NumPy's ``.npy`` serialisation in the byte tensor ``raw`` holds, viewing
    ``raw``'s memory (no copy); ``BlobError`` for a pickle, a truncated array or trailing
    bytes."""
    start, shape, fortran, dtype = _npy_header(raw[:MAX_NPY_HEADER].tobytes(), raw.nbytes)
    try:
        flat = np.frombuffer(raw, dtype=dtype, count=math.prod(shape), offset=start)
        return flat.reshape(shape, order="F" if fortran else "C")
    except (ValueError, TypeError):
        raise BlobError("an array's bytes do not match its header") from None


def parameter_views(parameters: Any) -> list[np.ndarray]:
    """Flower's ``parameters_to_ndarrays`` of the legacy ``Parameters`` without the copy:
    read-only arrays viewing its bytes (a global model or an update a process keeps anyway);
    Flower's reader where they are not NumPy's format (it says why)."""
    from flwr.common import parameters_to_ndarrays

    try:
        return [npy_array(np.frombuffer(tensor, np.uint8)) for tensor in parameters.tensors]
    except BlobError:
        return parameters_to_ndarrays(parameters)


def _npy_header(prefix: bytes, nbytes: int) -> tuple[int, tuple[int, ...], bool, np.dtype]:
    """The ``.npy`` header at the start of ``prefix`` (the first bytes of an array's ``nbytes``
    bytes): where its values start, its shape, whether they are in Fortran order, its dtype.
    ``BlobError`` for a pickle, or values that would not fill ``nbytes`` exactly."""
    from numpy.lib import format as npy

    head = io.BytesIO(prefix)
    try:
        version = npy.read_magic(head)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(head)
        elif version == (2, 0):
            shape, fortran, dtype = npy.read_array_header_2_0(head)
        else:
            raise BlobError(f".npy format version {version} is not read here")
    except (ValueError, TypeError, SyntaxError, EOFError) as exc:
        if isinstance(exc, BlobError):
            raise
        raise BlobError("an array is not in NumPy's .npy format") from None
    if dtype.hasobject:
        raise BlobError("an array holds Python objects (a pickle)")
    count = math.prod(shape)  # Python's integers: a claimed shape cannot wrap around
    if dtype.itemsize == 0 or head.tell() + count * dtype.itemsize != nbytes:
        raise BlobError("an array's bytes do not match its header")
    return head.tell(), tuple(shape), bool(fortran), dtype


def write_npy_header(buffer: BinaryIO, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """Write the header ``np.save`` writes for a C-ordered array of ``dtype`` and ``shape``
    at the start of the empty ``buffer`` (its values follow, in C order)."""
    from numpy.lib import format as npy

    header = {"descr": npy.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    try:
        npy.write_array_header_1_0(buffer, header)
    except ValueError:  # a header too long for version 1.0, as np.save falls back
        buffer.seek(0)
        buffer.truncate()
        npy.write_array_header_2_0(buffer, header)


@dataclass(frozen=True)
class NpyPlace:
    """Where one array's values lie in a blob file: ``offset``, the byte of the file its first
    value starts at; its ``dtype`` and ``shape``; whether the values are in Fortran order."""

    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran: bool

    @property
    def count(self) -> int:
        return math.prod(self.shape)


def npy_places_file(path: Path, record: str) -> list[NpyPlace]:
    """Where the values of each array of ``record`` lie in the blob in ``path``, in order,
    from the headers alone (safetensors' and each array's ``.npy`` header; no value is
    read). ``BlobError`` for anything ``ndarrays_file`` would refuse there."""
    layout, _sizes = layout_file(path)
    places = []
    try:
        with _TensorFile(path) as tensors:
            for i, entry in enumerate(layout):
                if entry[0] == record:
                    begin, end = tensors.span(str(i))
                    prefix = tensors.read_at(begin, min(MAX_NPY_HEADER, end - begin))
                    start, shape, fortran, dtype = _npy_header(prefix, end - begin)
                    places.append(NpyPlace(begin + start, dtype, shape, fortran))
    except (ValueError, TypeError, KeyError, OSError) as exc:
        if isinstance(exc, BlobError):
            raise
        raise BlobError(f"not a fedweave safetensors blob ({type(exc).__name__})") from None
    return places


def read_values(file: BinaryIO, place: NpyPlace, start: int, count: int) -> np.ndarray:
    """Values ``start`` to ``start + count`` of the array at ``place`` (in the order they are
    stored), read from the open blob ``file`` into a fresh array of their dtype."""
    values = np.empty(count, place.dtype)
    file.seek(place.offset + start * place.dtype.itemsize)
    if file.readinto(memoryview(values).cast("B")) != values.nbytes:
        raise BlobError("the blob ends before its tensors do")
    return values


def _records(layout: list, tensor: Any, leave: str | None = None) -> dict[str, Any]:
    """The array records of ``layout`` but ``leave``, tensor ``i`` being ``tensor(str(i))``
    (taken once: a uint8 array, or its bytes)."""
    from flwr.app import Array, ArrayRecord

    records: dict[str, dict[str, Any]] = {}
    for i, (name, key, dtype, shape, stype) in enumerate(layout):
        if name == leave:
            continue
        try:
            data = tensor(str(i))
        except KeyError:
            raise BlobError("its tensors do not match its layout") from None
        if isinstance(data, np.ndarray):
            if data.dtype != np.uint8 or data.ndim != 1:
                raise BlobError(f"tensor {i} is not a byte string")
            data = data.tobytes()
        array = Array(dtype=dtype, shape=tuple(shape), stype=stype, data=data)
        del data
        records.setdefault(name, {})[key] = array
    return {name: ArrayRecord(array_dict=arrays) for name, arrays in records.items()}


def _layout(metadata: Any) -> list[tuple[str, str, str, list[int], str]]:
    """The checked layout in a blob's safetensors metadata."""
    try:
        layout = json.loads(metadata[LAYOUT_KEY])
    except (ValueError, KeyError, TypeError):
        raise BlobError("no fedweave layout in its header") from None
    if not isinstance(layout, list) or len(layout) > MAX_ARRAYS:
        raise BlobError("its layout is not a list of arrays")
    checked, seen = [], set()
    for entry in layout:
        if not (
            isinstance(entry, list)
            and len(entry) == 5
            and all(isinstance(entry[i], str) for i in (0, 1, 2, 4))
            and isinstance(entry[3], list)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in entry[3])
        ):
            raise BlobError("an entry of its layout is malformed")
        if (entry[0], entry[1]) in seen:
            raise BlobError(f"array {entry[0]}/{entry[1]} appears twice")
        seen.add((entry[0], entry[1]))
        checked.append(tuple(entry))
    return checked  # type: ignore[return-value]
