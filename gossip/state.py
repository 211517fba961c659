"""What the parts of one peer share: who it is, the model it gossips and the round it is at.

``Discovery``, ``Exchange``, ``Joining`` and ``Peer`` all hold the same ``PeerState``: each
message they send carries its id, address and round, and they read or replace the same
weights (training, mixing, a late joiner's catch-up). One thread drives every part, so
sharing it needs no lock.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedweave.gossip import wire
from fedweave.gossip.schedule import SlotSchedule


@dataclass
class PeerState:
    """This peer and its model.

    Attributes:
        peer_id / addr: this peer's id and listen endpoint.
        weights: the current model (replaced, never modified in place: a zero-copy send may
            still hold the old arrays).
        num_examples: this peer's weight in example-weighted averages.
        schema: ``wire.schema_hash`` of the model; messages with another one are dropped.
        start: the sha256 of the initial model file the peer started from (``--initial-model``),
            ``""`` for the task's own initialisation; model messages carry it, and those of a
            peer that started elsewhere are refused (``start-mismatch``).
        round: the last completed round (or the round a late joiner caught up to).
        schedule: the slot lattice every message advertises (``None``: back-to-back rounds).
        done: its rounds are over and it only answers others (lingering); every message
            says so, so lingering peers know when nobody needs them any more.
    """

    peer_id: str
    addr: str
    weights: OrderedDict[str, np.ndarray]
    num_examples: int
    schema: str
    start: str = ""
    round: int = 0
    schedule: SlotSchedule | None = None
    done: bool = False

    def message(self, type_: str, xid: int = 0, **fields: Any) -> wire.Message:
        """A message from this peer at its current round, carrying its slot."""
        slot = None if self.schedule is None else self.schedule.advertise(time.monotonic())
        if type_ in wire.MODEL_TYPES:
            fields.setdefault("start", self.start)
        return wire.Message(
            type_, self.peer_id, self.addr, self.round, xid, slot=slot, done=self.done, **fields
        )
