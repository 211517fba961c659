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

A placeholder is honoured only under a handle this registry gave out, for the node it was
given for: a site writing such an ``Array`` itself names nothing the coordinator holds, and
its update is rejected like any unreadable one.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SPOOLED_STYPE = "fedweave.spooled"
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
        self._collecting = False

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
        held, self._held = self._held, {}
        for one in held.values():
            one.path.unlink(missing_ok=True)
