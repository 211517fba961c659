"""Bytes each site sent and was sent, per round, as the coordinator's grid saw them.

``OutcomeGrid`` counts every message it sends and every reply it receives: the bytes of
their arrays as Flower serialises them (NumPy's format: the data plus a 128-byte header per
array; models, updates, compressed updates) and of the byte strings in their config records
(SecAgg+'s masked vectors, keys and shares travel that way). Message envelopes and small
numbers are not counted, so the figures are what the model and its updates cost on the
wire, in every mode (plain, compressed, SecAgg+), not the transport's framing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_ROUNDS_KEPT = 8
"""Rounds whose counts are kept; a round's are read when it ends."""


@dataclass
class SiteTraffic:
    """One site's bytes in one round: ``train_in`` it sent the coordinator in the round's
    training (SecAgg+'s stages included), ``train_out`` the coordinator sent it for that;
    ``other_in`` / ``other_out`` for the rest (evaluation)."""

    train_in: int = 0
    train_out: int = 0
    other_in: int = 0
    other_out: int = 0


def payload_bytes(content: Any, spooled: Any | None = None) -> int:
    """Bytes of a message's content: its serialised arrays and its config records' byte
    strings; an update kept on disk (``spooled``: the ``SpooledUpdates`` that hold it) counts
    as the arrays it stands for."""
    total = 0
    for record in content.array_records.values():
        for array in record.values():
            held = spooled.payload_bytes(array) if spooled is not None else None
            total += len(array.data) if held is None else held
    for record in content.config_records.values():
        for value in record.values():
            if isinstance(value, bytes):
                total += len(value)
            elif isinstance(value, list) and value and isinstance(value[0], bytes):
                total += sum(len(item) for item in value)
    return total


class Traffic:
    """The counts of the last ``MAX_ROUNDS_KEPT`` rounds, by round (Flower's group id) and
    node; ``spooled``: the ``SpooledUpdates`` whose placeholders count as their updates."""

    def __init__(self, spooled: Any | None = None) -> None:
        self._rounds: dict[str, dict[int, SiteTraffic]] = {}
        self._spooled = spooled

    def _site(self, group_id: str, node_id: int) -> SiteTraffic:
        if group_id not in self._rounds:
            self._rounds[group_id] = {}
            while len(self._rounds) > MAX_ROUNDS_KEPT:
                del self._rounds[next(iter(self._rounds))]
        return self._rounds[group_id].setdefault(int(node_id), SiteTraffic())

    def sent(self, message: Any) -> None:
        """Count ``message``, about to go to its destination node."""
        from flwr.app import MessageType

        site = self._site(message.metadata.group_id, message.metadata.dst_node_id)
        size = payload_bytes(message.content)
        if message.metadata.message_type == MessageType.TRAIN:
            site.train_out += size
        else:
            site.other_out += size

    def received(self, reply: Any, asked: Any) -> None:
        """Count ``reply``, the answer to ``asked``."""
        from flwr.app import MessageType

        if reply.has_error():
            return
        site = self._site(asked.metadata.group_id, asked.metadata.dst_node_id)
        size = payload_bytes(reply.content, self._spooled)
        if asked.metadata.message_type == MessageType.TRAIN:
            site.train_in += size
        else:
            site.other_in += size

    def of_round(self, server_round: int | str) -> dict[int, SiteTraffic]:
        """Every counted site of ``server_round`` (Flower's numbering)."""
        return dict(self._rounds.get(str(server_round), {}))
