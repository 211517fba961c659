"""Receiving: every message a peer gets arrives through ``Inbox.serve(timeout_s)``.

``serve`` waits at most ``timeout_s`` for messages on the transport, decodes each one with
``fedweave.gossip.wire`` (the only parser), checks that it comes from the peer it claims and on
the channel its type belongs to, and hands it to the peer's dispatcher. Anything malformed,
spoofed or refused by a handler (``wire.WireError``) is counted per reason and dropped (logged
at most once per sender per minute), never raised to the caller. An offer of another model
(``schema-mismatch``), or of a model started from another initial model (``start-mismatch``),
is also answered ``refused`` with the reason, so its sender learns why.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from fedweave.gossip import wire
from fedweave.gossip.discovery import SEED_PREFIX
from fedweave.gossip.transport import Incoming, Transport, wait_until

log = logging.getLogger("fedweave.gossip")

MISMATCHES = ("schema-mismatch", "start-mismatch")
"""Faults an offer's sender is told of (a ``refused`` reply with the reason): it runs another
model, or started from another one, than this peer."""

Dispatch = Callable[[Incoming, wire.Message], None]
"""Acts on one checked message; may raise ``wire.WireError`` to have it counted as dropped."""


class Inbox:
    """The receiving side of one peer.

    Args:
        transport: the peer's sockets.
        schema: this peer's model schema hash (model messages with another one are dropped).
        max_bytes: the largest accepted message.
        dispatch: what to do with each checked message (``Peer`` routes it to its parts).
        stopping: true once the peer was asked to stop; ``serve_for`` then returns.
        start: the sha256 of the initial model this peer started from (``""``: the task's
            own initialisation); model messages of a peer that started elsewhere are dropped.
    Attributes:
        refuse: answers an offer of another model with ``refused`` and the reason; the
            ``Peer`` sets it to ``Exchange.refuse`` (which is built on this inbox).
    """

    def __init__(
        self,
        transport: Transport,
        schema: str,
        max_bytes: int,
        dispatch: Dispatch,
        stopping: Callable[[], bool],
        start: str = "",
    ) -> None:
        self.refuse: Callable[[bytes, wire.Message, str], None] | None = None
        self.transport = transport
        self.schema = schema
        self.start = start
        self.max_bytes = max_bytes
        self.dispatch = dispatch
        self.stopping = stopping
        self.drops: Counter[str] = Counter()
        self._last_logged: dict[str, float] = {}

    def serve(self, timeout_s: float) -> None:
        """Handle whatever arrives within ``timeout_s`` seconds (0: only what is queued)."""
        for incoming in self.transport.poll(timeout_s):
            if incoming.oversize:
                limit = self.transport.max_total_bytes
                self._drop(incoming.origin, "too-large", f"{incoming.nbytes} bytes, over {limit}")
                continue
            try:
                self.dispatch(incoming, self._check(incoming))
            except wire.WireError as exc:
                self._drop(incoming.origin, exc.reason, str(exc))
                told = exc.message
                if exc.reason in MISMATCHES and told is not None and told.type == wire.OFFER:
                    if incoming.route is not None and self.refuse is not None:
                        reason = (
                            self._schema_reason()
                            if exc.reason == "schema-mismatch"
                            else self._start_reason(told.start)
                        )
                        self.refuse(incoming.route, told, reason)

    def serve_for(self, timeout_s: float, poll_s: float = float("inf")) -> None:
        """Keep handling messages for ``timeout_s`` seconds, or until the peer stops; polls
        of at most ``poll_s`` seconds notice a stop sooner."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stopping():
            self.serve(min(poll_s, wait_until(deadline)))

    def _schema_reason(self) -> str:
        return (
            f"schema-mismatch: this peer's model has schema {self.schema[:16]}; compare "
            "`fedweave task describe NAME` on both sides (same task and model?)"
        )

    def _start_reason(self, theirs: str) -> str:
        return (
            f"start-mismatch: this peer started from initial model {_named(self.start)}, "
            f"yours from {_named(theirs)}; start every peer with the same --initial-model"
        )

    def _check(self, inc: Incoming) -> wire.Message:
        """Decode ``inc`` and check who sent it on which channel (``WireError`` if wrong)."""
        msg = wire.decode(
            inc.frames, self.max_bytes, expected_schema=self.schema, expected_start=self.start
        )
        if inc.authenticated_id is not None and msg.sender != inc.authenticated_id:
            raise wire.WireError("spoofed-id", f"claims {msg.sender}")
        via_seed = inc.neighbour is not None and inc.neighbour.startswith(SEED_PREFIX)
        if (
            via_seed
            and "#" in (inc.neighbour or "")
            and not (inc.neighbour or "").endswith("#" + msg.sender)
        ):
            raise wire.WireError("spoofed-id", f"{msg.sender} answered for {inc.neighbour}")
        if inc.neighbour is not None and not via_seed and msg.sender != inc.neighbour:
            raise wire.WireError("spoofed-id", f"{msg.sender} answered for {inc.neighbour}")
        if inc.route is None and msg.type in (wire.HELLO, wire.OFFER):
            raise wire.WireError("unexpected", f"{msg.type} on a reply channel")
        if inc.route is not None and msg.type in (wire.PEERS, wire.REPLY):
            raise wire.WireError("unexpected", f"{msg.type} on the inbox")
        return msg

    def _drop(self, origin: str, reason: str, detail: str) -> None:
        """Count a bad message (per reason); log at most one line per sender per minute."""
        self.drops[reason] += 1
        now, key = time.monotonic(), origin
        if now - self._last_logged.get(key, -1e9) >= 60.0:
            self._last_logged[key] = now
            if len(self._last_logged) > 10_000:
                self._last_logged.clear()
            log.warning(
                "dropped a message from %s: %s (%d dropped so far)",
                origin,
                detail,
                sum(self.drops.values()),
            )


def _named(start: str) -> str:
    return f"sha256 {start[:16]}" if start else "none (the task's own initialisation)"
