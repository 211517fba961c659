"""A round's tensors beside Flower's messages (``fedweave coordinator --bulk-address``): a grid
wrapper.

``BulkGrid`` sits just outside the SuperLink's grid, under the grid that binds outcomes to
sites and counts bytes (``OutcomeGrid``), so every workflow (plain rounds, SecAgg+'s stages,
evaluation, the federated statistics, FedBuff's jobs) sends through it unchanged:

- on the way out, each message's array records are written once to the spool as one blob
  (``fedweave/bulk/``), and the message travels without them, carrying a ticket instead
  (``BULK_TICKET_RECORD``: the transfer port, a token for that site alone, the blobs' digests
  and sizes); the workflow's own message is given its content back once pushed;
- on the way back, a reply that says its tensors were uploaded (``BULK_RECEIPT_RECORD``) gets
  them back from the spool, if the upload was made under the token of a message to the node
  the reply comes from and is the one the reply names; otherwise the reply becomes that site's
  failure (``malformed reply: ...``), bound to its node, and the round goes on. While a plain
  fit exchange is ``collecting`` (``spooled``), a training reply's update stays in its file
  and the reply carries a placeholder for the strategy to read it by
  (``spooled_updates.py``): the ServerApp holds one update at a time, not every site's; so
  does SecAgg+'s masked vector while its collect stage is ``collecting_vectors``.

The site's side is ``client/bulk_mod.py``; the server between them runs in the coordinator's
process (``fedweave/bulk/server.py``). Grants end with the exchange that made them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedweave.bulk.records import BlobError, decoded_file, encoded_parts, layout_file
from fedweave.bulk.spool import Spool
from fedweave.contract import BULK_RECEIPT_RECORD, BULK_TICKET_RECORD, SITE_FAILED_CODE
from fedweave.coordinator.rounds.spooled_updates import SpooledUpdates

FIT_PARAMETERS_RECORD = "fitres.parameters"
"""The array record of a legacy fit result (Flower's ``recorddict_to_fitres``): the update."""

GRANT_MARGIN_S = 120.0
"""Seconds a grant outlives the exchange's timeout (a site fetching as its round starts late)."""
UNTIMED_GRANT_S = 6 * 3600.0
"""A grant's life when the exchange has no timeout (FedBuff's jobs, an untimed round)."""
UPLOAD_ALLOWANCE = 16 << 20
"""Bytes a site may upload beyond twice the largest model this grid has sent (an update is the
model's size, compressed smaller; SecAgg+'s masked vector as large)."""


@dataclass
class _Sent:
    message: Any
    content: Any
    token: str


class BulkGrid:
    """A grid whose messages' tensors move through the transfer server (see the module);
    everything else is the wrapped grid's.

    Parameters
    ----------
    grid : Grid
        The SuperLink's grid.
    spool : Spool
        The folder shared with the coordinator's transfer server.
    port : int
        The transfer server's port; a site connects to the host it reaches the coordinator at.
    spooled : SpooledUpdates | None (default: None)
        Where plain rounds' updates are held on disk while it is ``collecting``; ``None``:
        every reply's tensors are read into it.
    """

    def __init__(
        self, grid: Any, spool: Spool, port: int, spooled: SpooledUpdates | None = None
    ) -> None:
        self._grid, self._spool, self._port = grid, spool, int(port)
        self._spooled = spooled
        self._largest = 0
        self._pushed: dict[str, _Sent] = {}

    def send_and_receive(self, messages, *, timeout: float | None = None):  # type: ignore[no-untyped-def]
        messages = list(messages)
        sent = self._ticketed(messages, timeout)
        try:
            try:
                replies = list(self._grid.send_and_receive(messages, timeout=timeout))
            finally:
                for one in sent:
                    one.message.content = one.content
            asked = {one.message.metadata.message_id: one.message for one in sent}
            return [self._received(reply, asked.get(reply.metadata.reply_to_message_id))
                    for reply in replies]  # fmt: skip
        finally:
            self._spool.release([one.token for one in sent])

    def push_messages(self, messages):  # type: ignore[no-untyped-def]
        messages = list(messages)
        sent = self._ticketed(messages, None)
        try:
            ids = list(self._grid.push_messages(messages))
        except BaseException:
            self._spool.release([one.token for one in sent])
            raise
        finally:
            for one in sent:
                one.message.content = one.content
        for one in sent:
            self._pushed[one.message.metadata.message_id] = one
        return ids

    def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
        replies = []
        for reply in self._grid.pull_messages(message_ids):
            one = self._pushed.pop(reply.metadata.reply_to_message_id, None)
            replies.append(self._received(reply, one.message if one is not None else None))
            if one is not None:
                self._spool.release([one.token])
        return replies

    def _ticketed(self, messages: list[Any], timeout: float | None) -> list[_Sent]:
        """Give each message a content without its tensors and with its ticket; returns what
        to give back and release."""
        from flwr.app import ConfigRecord, RecordDict

        lifetime = (timeout + GRANT_MARGIN_S) if timeout is not None else UNTIMED_GRANT_S
        blobs: dict[tuple[int, ...], tuple[str, int]] = {}
        sent: list[_Sent] = []
        try:
            for message in messages:
                original = message.content
                fetch, names = [], []
                for name, record in original.array_records.items():
                    if not len(record):
                        continue
                    key = tuple(id(array.data) for array in record.values())
                    if key not in blobs:  # the exchange's messages share one model
                        blobs[key] = self._spool.put_parts(encoded_parts({name: record}))
                        self._largest = max(self._largest, blobs[key][1])
                    fetch.append(blobs[key])
                    names.append(name)
                token = self._spool.grant(
                    message.metadata.dst_node_id, [digest for digest, _ in fetch],
                    2 * self._largest + UPLOAD_ALLOWANCE, lifetime,
                )  # fmt: skip
                sent.append(_Sent(message, original, token))
                wire = RecordDict(
                    {key: value for key, value in original.items() if key not in names}
                )
                wire[BULK_TICKET_RECORD] = ConfigRecord({
                    "port": self._port, "token": token, "records": names,
                    "fetch": [f"{digest}:{size}" for digest, size in fetch],
                })  # fmt: skip
                message.content = wire
        except BaseException:
            for one in sent:
                one.message.content = one.content
            self._spool.release([one.token for one in sent])
            raise
        return sent

    def _received(self, reply: Any, asked: Any) -> Any:
        """``reply`` with its uploaded tensors back, or its site's failure (see the module)."""
        from flwr.app import Error, Message

        if asked is None or reply.has_error():
            return reply
        receipt = reply.content.config_records.get(BULK_RECEIPT_RECORD)
        if receipt is None:
            return reply
        problem, records = None, {}
        upload = self._spool.take_upload(str(receipt.get("upload", "")), asked.metadata.dst_node_id)
        if upload is None or reply.metadata.src_node_id != asked.metadata.dst_node_id:
            problem = "it names an upload the coordinator does not hold for this site"
        elif upload.digest != receipt.get("digest"):
            problem = "its upload is not the one it names"
        else:
            try:
                records = self._held(upload, asked) or decoded_file(upload.path)
            except BlobError as exc:
                problem = f"its upload is not a tensor blob: {exc}"
        if upload is not None:
            upload.path.unlink(missing_ok=True)
        if set(records) & set(reply.content):  # it would replace what the reply says
            problem = "its upload names a record its reply already has"
        if problem is not None:
            return Message(
                Error(code=SITE_FAILED_CODE, reason=f"malformed reply: {problem}"), reply_to=asked
            )
        del reply.content.config_records[BULK_RECEIPT_RECORD]
        for name, record in records.items():
            reply.content.array_records[name] = record
        return reply

    def _held(self, upload: Any, asked: Any) -> dict[str, Any]:
        """A placeholder record for a plain training update, or a SecAgg+ masked vector, kept
        in its file (moved aside from its grant), when the exchange is ``collecting`` (its
        vectors); ``{}`` to read the upload instead."""
        from flwr.app import MessageType

        spooled = self._spooled
        if spooled is not None and spooled.collecting_vectors_now:
            return self._held_vector(upload, asked)
        if spooled is None or not spooled.collecting_now:
            return {}
        if asked.metadata.message_type != MessageType.TRAIN:
            return {}
        layout, sizes = layout_file(upload.path)
        if {entry[0] for entry in layout} != {FIT_PARAMETERS_RECORD}:
            return {}
        held = self._spool.hold(upload)
        placeholder = spooled.hold(
            asked.metadata.dst_node_id, held, FIT_PARAMETERS_RECORD, sum(sizes)
        )
        return {FIT_PARAMETERS_RECORD: placeholder}

    def _held_vector(self, upload: Any, asked: Any) -> dict[str, Any]:
        """A placeholder for a SecAgg+ masked vector kept in its file (integer arrays, as
        their headers say); ``{}`` to read any other upload, or a vector the layout check
        will refuse, as before."""
        from fedweave.bulk.records import npy_places_file
        from fedweave.flower_patches.secagg_vectors import (
            MASKED_VECTOR_RECORD,
            asks_for_masked_vector,
        )

        if not asks_for_masked_vector(asked):
            return {}
        layout, sizes = layout_file(upload.path)
        if MASKED_VECTOR_RECORD not in {entry[0] for entry in layout}:
            return {}
        places = npy_places_file(upload.path, MASKED_VECTOR_RECORD)
        if not places or any(place.dtype.kind not in "iu" for place in places):
            return {}
        others = decoded_file(upload.path, leave=MASKED_VECTOR_RECORD)  # the fit result's
        held = self._spool.hold(upload)
        vector_sizes = [
            size for entry, size in zip(layout, sizes) if entry[0] == MASKED_VECTOR_RECORD
        ]
        placeholder = self._spooled.hold_vector(
            asked.metadata.dst_node_id, held, places, vector_sizes
        )
        return {**others, MASKED_VECTOR_RECORD: placeholder}

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._grid, name)
