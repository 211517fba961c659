"""Plain rounds' updates kept on disk until the round adds them up: the coordinator's memory
does not grow with the sites.

Deployed with ``--bulk-address``, a site's update arrives as a file in the transfer spool
(``fedweave/bulk/``). Read into the reply, every site's update would be held at once until the
strategy averages them: the ServerApp grew by one model per site. While a plain fit exchange
``collecting()``, ``BulkGrid`` leaves each training reply's update in its file and puts a
placeholder in the reply instead (one ``Array`` of stype ``SPOOLED_STYPE`` whose bytes are a
random handle); the reporting strategy then reads the updates one at a time, to check each,
and again to add each into the weighted mean (``ReportingStrategy``), and the files go when
the exchange's round is done.

SecAgg+'s masked vectors are held the same way while its collect stage is
``collecting_vectors()``: each array of a site's vector is a placeholder ``Array`` in the
reply's ``MASKED_VECTOR_RECORD`` carrying the shape and dtype its file's header declares, and
the stage adds the vectors up from their files a part at a time
(``DeadlineSecAggPlusWorkflow.masked_vector``, ``secagg_sum``).

A placeholder is honoured only under a handle this registry gave out, for the node it was
given for: a site writing such an ``Array`` itself names nothing the coordinator holds, and
its update is rejected like any unreadable one (its masked vector fails the site in
``OutcomeGrid``'s layout check, before any sum).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedweave.bulk.spool import HELD_STYPE

SPOOLED_STYPE = HELD_STYPE
"""The stype of a placeholder ``Array``; its bytes are the handle."""
SPOOLED_KEY = "spooled"
"""The placeholder's key in its array record."""


class SpooledError(ValueError):
    """A placeholder naming nothing held for its site, or a held update that is not arrays."""


@dataclass(frozen=True)
class _Held:
    node: int
    path: Path
    record: str
    payload_bytes: int


class SpooledUpdates:
    """The updates held on disk for the exchange now ``collecting()`` (see the module)."""

    def __init__(self) -> None:
        self._held: dict[bytes, _Held] = {}
        self._vectors: dict[tuple[bytes, ...], tuple[int, Path, list[Any]]] = {}
        self._collecting = False
        self._collecting_vectors = False

    @property
    def collecting_now(self) -> bool:
        """Whether replies should be held (a plain fit exchange and its round are running)."""
        return self._collecting

    @contextmanager
    def collecting(self) -> Iterator[None]:
        """Hold the training replies of the exchange run inside; remove their files after."""
        self._collecting = True
        try:
            yield
        finally:
            self._collecting = False
            self.discard()

    @property
    def collecting_vectors_now(self) -> bool:
        """Whether SecAgg+'s masked vectors should be held (its collect stage is running)."""
        return self._collecting_vectors

    @contextmanager
    def collecting_vectors(self) -> Iterator[None]:
        """Hold the masked vectors of the SecAgg+ collect stage run inside; remove their files
        after (the stage has added them up by then)."""
        self._collecting_vectors = True
        try:
            yield
        finally:
            self._collecting_vectors = False
            self.discard()

    def hold_vector(self, node: int, path: Path, places: list[Any], sizes: list[int]) -> Any:
        """The placeholder ``ArrayRecord`` for the masked vector of ``node`` in ``path``: one
        ``Array`` per array, in order, with the shape and dtype of its ``places``
        (``fedweave.bulk.records.NpyPlace``) and ``sizes`` (each array's bytes in the
        message) counted as its payload."""
        from flwr.app import Array, ArrayRecord

        handles = []
        arrays = {}
        for index, (place, size) in enumerate(zip(places, sizes, strict=True)):
            handle = secrets.token_hex(16).encode()
            self._held[handle] = _Held(int(node), Path(path), "", int(size))
            handles.append(handle)
            arrays[str(index)] = Array(
                dtype=str(place.dtype), shape=tuple(place.shape), stype=SPOOLED_STYPE, data=handle
            )
        self._vectors[tuple(handles)] = (int(node), Path(path), list(places))
        return ArrayRecord(array_dict=arrays)

    def vector_layout(self, record: Any, node: int) -> tuple[tuple[int, ...], ...] | None:
        """The shapes of the masked vector the placeholder ``record`` stands for, when this
        registry holds it for ``node``; None otherwise."""
        held = self._vectors.get(tuple(array.data for array in record.values()))
        if held is None or held[0] != int(node):
            return None
        return tuple(tuple(place.shape) for place in held[2])

    def vector_places(self, record: Any, node: int) -> tuple[Path, list[Any]]:
        """The file of the masked vector the placeholder ``record`` stands for and where its
        arrays' values lie in it; ``SpooledError`` when it is not one held for ``node``."""
        held = self._vectors.get(tuple(array.data for array in record.values()))
        if held is None or held[0] != int(node):
            raise SpooledError("its masked vector names nothing the coordinator holds for it")
        return held[1], held[2]

    def vector_source(self, reply: Any) -> Any:
        """The masked vector a collect-stage ``reply`` carries as placeholders, read from its
        file a part at a time (``fedweave.bulk.array_parts.HeldUpdate``); None where it
        carries none. ``SpooledError`` for a placeholder not held for the reply's site (the
        layout check failed that site before: ``site_outcomes.masked_vector_problems``)."""
        from fedweave.bulk.array_parts import HeldUpdate
        from fedweave.flower_patches.secagg_vectors import MASKED_VECTOR_RECORD

        record = reply.content.array_records.get(MASKED_VECTOR_RECORD)
        if record is None or not any(array.stype == SPOOLED_STYPE for array in record.values()):
            return None
        return HeldUpdate(*self.vector_places(record, reply.metadata.src_node_id))

    def hold(self, node: int, path: Path, record: str, payload_bytes: int) -> Any:
        """The placeholder ``ArrayRecord`` for the update of ``node`` in ``path`` (array record
        ``record`` of its blob; ``payload_bytes``: what its arrays' bytes would have been in
        the message)."""
        from flwr.app import Array, ArrayRecord

        handle = secrets.token_hex(16).encode()
        self._held[handle] = _Held(int(node), Path(path), record, int(payload_bytes))
        placeholder = Array(dtype="", shape=(), stype=SPOOLED_STYPE, data=handle)
        return ArrayRecord(array_dict={SPOOLED_KEY: placeholder})

    def payload_bytes(self, array: Any) -> int | None:
        """The bytes the update ``array`` stands in for would have had in the message, or
        ``None`` when it is not a placeholder this registry holds."""
        held = self._held.get(array.data) if array.stype == SPOOLED_STYPE else None
        return held.payload_bytes if held is not None else None

    @staticmethod
    def is_placeholder(parameters: Any) -> bool:
        """Whether Flower's legacy ``Parameters`` are a placeholder's (a site may write one)."""
        return parameters.tensor_type == SPOOLED_STYPE

    def arrays(self, parameters: Any, node: int) -> list[np.ndarray]:
        """The update a placeholder's ``parameters`` stand for, read from its file (the
        arrays view one read of it); ``SpooledError`` when it is not one held for ``node``, or
        its file does not hold arrays."""
        return list(self.arrays_one_by_one(parameters, node))

    def arrays_one_by_one(self, parameters: Any, node: int) -> Iterator[np.ndarray]:
        """``arrays``, one array at a time (each let go before the next is read)."""
        from fedweave.bulk.records import BlobError, ndarrays_file

        held = self._held_for(parameters)
        if held is None or held.node != int(node):
            raise SpooledError("its update names nothing the coordinator holds for it")
        try:
            yield from ndarrays_file(held.path, held.record)
        except BlobError as exc:
            raise SpooledError(f"its update is not arrays: {exc}") from None

    def places(self, parameters: Any, node: int) -> tuple[Path, list[Any]]:
        """The file of the update a placeholder's ``parameters`` stand for, and where each of
        its arrays' values lie in it (``fedweave.bulk.records.NpyPlace``, from the headers
        alone), to read a part of every update at a time; ``SpooledError`` as ``arrays``."""
        from fedweave.bulk.records import BlobError, npy_places_file

        held = self._held_for(parameters)
        if held is None or held.node != int(node):
            raise SpooledError("its update names nothing the coordinator holds for it")
        try:
            return held.path, npy_places_file(held.path, held.record)
        except BlobError as exc:
            raise SpooledError(f"its update is not arrays: {exc}") from None

    def tensor_bytes(self, parameters: Any) -> Iterator[Any]:
        """The bytes of each array a placeholder's ``parameters`` stand for, one at a time, as
        ``Parameters.tensors`` would hold them (the placeholder's own bytes when it names
        nothing held)."""
        from fedweave.bulk.records import BlobError, arrays_file

        held = self._held_for(parameters)
        if held is None:
            yield from parameters.tensors
            return
        try:
            yield from arrays_file(held.path, held.record)
        except BlobError:
            return

    def _held_for(self, parameters: Any) -> _Held | None:
        """What a placeholder's ``parameters`` name, if this registry holds it."""
        return self._held.get(parameters.tensors[0]) if len(parameters.tensors) == 1 else None

    def discard(self) -> None:
        """Remove every held file and forget its handle."""
        held, self._held, self._vectors = self._held, {}, {}
        for one in held.values():
            one.path.unlink(missing_ok=True)
