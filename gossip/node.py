"""A peer's network side: the messages it sends and how it handles what arrives.

``Node`` owns the sockets, the member table and the model, and is driven by one thread (the
peer loop in ``fedweave.gossip.peer``): ``_serve(timeout)`` handles whatever arrived within the
deadline. Every inbound message is decoded by ``fedweave.gossip.wire`` (the only parser); anything
malformed is counted and dropped, never raised to the loop.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

import numpy as np

from fedweave.errors import UserError
from fedweave.gossip import averaging, wire
from fedweave.gossip.config import PeerConfig
from fedweave.gossip.history_writer import HistoryWriter, ResultsLog
from fedweave.gossip.keys import KeyRing, anonymous_peer_id, load_keyring
from fedweave.gossip.learner import Learner, build_learner
from fedweave.gossip.membership import Membership
from fedweave.gossip.schedule import SlotClock
from fedweave.gossip.transport import Incoming, Transport

log = logging.getLogger("fedweave.gossip")
SEED_PREFIX = "seed:"
MAX_DEFERRED = 16
"""Offers held back while our own offer is out; past that (or a second one from the same
sender) the answer is ``busy``, so a flood of offers cannot pile up models in memory."""


@dataclass
class _Pending:
    peer_id: str
    snapshot: OrderedDict[str, np.ndarray]
    expires: float
    round: int
    pull: bool = False
    group_total: int | None = None


class Node:
    """Sockets, members and model of one peer, plus the message handlers."""

    def __init__(self, config: PeerConfig) -> None:
        if config.mix not in averaging.MIX_RULES:
            raise UserError(
                f"unknown --mix '{config.mix}': use one of {', '.join(averaging.MIX_RULES)}"
            )
        if config.fanout < 1:
            raise UserError("--fanout must be at least 1")
        self.config = config
        self.keyring: KeyRing | None = load_keyring(config.keys) if config.keys else None
        self.max_bytes = config.max_message_mb * (1 << 20)
        self.transport = Transport(config.listen, self.keyring, self.max_bytes)
        self.addr = self.transport.address
        ident = self.keyring.identity.peer_id if self.keyring else anonymous_peer_id(self.addr)
        self.peer_id = ident
        self.members = Membership(ident, self.addr, config.drop_after, rng=random.Random())
        if self.keyring is not None:
            self.members.allowed_ids = set(self.keyring.allowed)
        try:
            self.learner: Learner = build_learner(config, ident)
        except BaseException:
            self.transport.close()
            raise
        self.weights = self.learner.weights()
        self.schema = wire.schema_hash(self.weights)
        self.n = self.learner.num_examples
        self.round = 0
        self.pending: dict[int, _Pending] = {}
        self.buffered: dict[str, tuple[OrderedDict[str, np.ndarray], int]] = {}
        self.replies: list[tuple[str, OrderedDict[str, np.ndarray], int]] = []
        self.tau_history: list[float] = []
        self.greeted: set[str] = set()
        self.awaiting: set[int] = set()
        self.deferred: list[tuple[bytes, wire.Message]] = []
        self.outcomes: dict[int, str] = {}
        self.known_n: dict[str, int] = {}
        self.group_share: dict[int, float] = {}
        self.pulled: list[tuple[int, OrderedDict[str, np.ndarray]]] = []
        self.busy_replies = 0
        self.mixes = 0
        self.slots = SlotClock(config.round_interval) if config.round_interval > 0 else None
        self.drops: Counter[str] = Counter()
        self._last_logged: dict[str, float] = {}
        self._stop_signal = 0
        self.history: HistoryWriter | None = None
        self.results = ResultsLog(config.results, config.dump_models)

    @property
    def stopping(self) -> bool:
        """A stop signal arrived (``Peer.request_stop``): every loop ends at its next check."""
        return self._stop_signal != 0

    # -- sending -------------------------------------------------------------------------

    def _ensure_dealer(self, peer_id: str) -> bool:
        member = self.members.members.get(peer_id)
        if member is None or not member.addr:
            return False
        if not self.transport.connected(peer_id):
            key = self.keyring.allowed.get(peer_id) if self.keyring else None
            if self.keyring is not None and key is None:
                return False
            self.transport.connect(peer_id, member.addr, key)
        return True

    def _hello(self, keys: list[str]) -> None:
        for key in keys:
            if not key.startswith(SEED_PREFIX) and not self._ensure_dealer(key):
                continue
            msg = wire.Message(
                wire.HELLO,
                self.peer_id,
                self.addr,
                self.round,
                peers=self.members.sample_entries(self.round, 8),
            )
            self.transport.send(key, wire.encode(msg))
            self.greeted.add(key)

    def _offer(self, peer_id: str, pull: bool = False, group_total: int | None = None) -> int:
        """Send our model (or a pull request) to ``peer_id``; returns the exchange id, 0 if
        the send failed (counts as a miss)."""
        if not self._ensure_dealer(peer_id):
            return 0
        xid = random.getrandbits(62) + 1
        snapshot = self.weights
        msg = wire.Message(
            wire.OFFER,
            self.peer_id,
            self.addr,
            self.round,
            xid,
            peers=self.members.sample_entries(self.round, 8),
            num_examples=self.n,
            schema=self.schema,
            pull=pull,
            tensors=OrderedDict() if pull else snapshot,
            share=None if group_total is None else self.n / group_total,
        )
        if not self.transport.send(peer_id, wire.encode(msg)):
            return 0
        expires = time.monotonic() + 3 * self.config.exchange_timeout
        self.pending[xid] = _Pending(peer_id, snapshot, expires, self.round, pull, group_total)
        return xid

    def _expire_pending(self) -> None:
        now = time.monotonic()
        for xid in [x for x, p in self.pending.items() if p.expires < now]:
            del self.pending[xid]

    # -- receiving -----------------------------------------------------------------------

    def _serve(self, timeout_s: float) -> None:
        for incoming in self.transport.poll(timeout_s):
            try:
                self._handle(incoming)
            except wire.WireError as exc:
                self._drop(incoming.origin, exc.reason, str(exc))

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

    def _handle(self, inc: Incoming) -> None:
        msg = wire.decode(inc.frames, self.max_bytes, expected_schema=self.schema)
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
        if msg.type == wire.BYE:
            self.members.left(msg.sender)
            for xid in [x for x, p in self.pending.items() if p.peer_id == msg.sender]:
                del self.pending[xid]  # it will never answer: stop waiting now
                self.outcomes[xid] = "left"
            self.transport.disconnect(msg.sender)
            return
        if self.members.heard_from(msg.sender, msg.addr, msg.round):
            log.info("peer %s is live (%s)", msg.sender, msg.addr)
        for new in self.members.merge(msg.peers)[:8]:
            if new not in self.greeted:
                self._hello([new])
        if msg.type in wire.MODEL_TYPES and msg.tensors:
            self.known_n[msg.sender] = msg.num_examples
        if msg.type == wire.HELLO:
            answer = wire.Message(
                wire.PEERS,
                self.peer_id,
                self.addr,
                self.round,
                peers=self.members.sample_entries(self.round, 32),
            )
            self.transport.reply(inc.route or b"", wire.encode(answer))
        elif msg.type == wire.PEERS:
            if via_seed and inc.neighbour is not None:
                self.transport.rename(inc.neighbour, msg.sender)
        elif msg.type == wire.OFFER:
            self._serve_offer(inc.route or b"", msg)
        elif msg.type == wire.REPLY:
            self._take_reply(msg)

    def _serve_offer(self, route: bytes, msg: wire.Message) -> None:
        mine = self.weights
        if self.config.mix == "pairwise" and self.awaiting and not msg.pull:
            # Mixing now would interleave with our own exchange. Offers from larger ids wait
            # until it is done (``_serve_deferred``); smaller ids hear busy. Waits then only
            # run from larger to smaller ids, so they never form a cycle.
            waiting = {m.sender for _, m in self.deferred}
            if (
                msg.sender > self.peer_id
                and msg.sender not in waiting
                and len(self.deferred) < MAX_DEFERRED
            ):
                self.deferred.append((route, msg))
                return
            busy = wire.Message(
                wire.REPLY,
                self.peer_id,
                self.addr,
                self.round,
                msg.xid,
                num_examples=self.n,
                schema=self.schema,
                status="busy",
            )
            self.transport.reply(route, wire.encode(busy))
            return
        reply = wire.Message(
            wire.REPLY,
            self.peer_id,
            self.addr,
            self.round,
            msg.xid,
            peers=self.members.sample_entries(self.round, 8),
            num_examples=self.n,
            schema=self.schema,
            tensors=mine,
        )
        if not self.transport.reply(route, wire.encode(reply)) or msg.pull:
            return  # no reply went out: do not mix either, so the sum stays exact
        self.mixes += 1
        if self.config.mix == "pairwise":
            self.weights = averaging.pairwise_update(
                mine, mine, msg.tensors, self.n, msg.num_examples, share=msg.share
            )
        else:
            self.buffered[msg.sender] = (msg.tensors, msg.num_examples)

    def _serve_deferred(self) -> None:
        """Answer the offers held back while our own exchange was out (call with
        ``awaiting`` empty: they are then served, one atomic exchange each)."""
        deferred, self.deferred = self.deferred, []
        for route, msg in deferred:
            self._serve_offer(route, msg)

    def _take_reply(self, msg: wire.Message) -> None:
        pending = self.pending.get(msg.xid)
        if pending is None or pending.peer_id != msg.sender:
            raise wire.WireError("stale-reply", f"xid {msg.xid}")
        del self.pending[msg.xid]
        if msg.xid in self.awaiting:
            self.outcomes[msg.xid] = "busy" if msg.status == "busy" else "ok"
        if msg.status == "busy":
            self.busy_replies += 1  # alive but mid-exchange: skip it this round, no miss
            return
        if msg.status != "ok" or not msg.tensors:
            raise wire.WireError("refused", f"reply status {msg.status}")
        if pending.pull:
            self.pulled.append((msg.round, msg.tensors))  # the joiner decides what to adopt
        elif self.config.mix == "pairwise":
            self.mixes += 1
            share = None
            if pending.group_total:
                share = min(1.0, msg.num_examples / pending.group_total)
            self.weights = averaging.pairwise_update(
                self.weights, pending.snapshot, msg.tensors, self.n, msg.num_examples, share
            )
        else:
            self.replies.append((msg.sender, msg.tensors, msg.num_examples))

    def _mix_robust(self) -> None:
        """``clipped`` / ``trimmed``: one mix per round over replies and offers received."""
        if self.config.mix == "pairwise":
            return
        models = {pid: (w, n) for pid, w, n in self.replies}
        models.update(self.buffered)
        self.buffered, self.replies = {}, []
        if not models:
            return
        if self.config.mix == "trimmed":
            self.weights = averaging.trimmed_mean(
                self.weights, [w for w, _ in models.values()], self.config.trim_fraction
            )
            return
        norms = [averaging.difference_norm(w, self.weights) for w, _ in models.values()]
        tau = self.config.clip_tau
        if tau is None:
            tau = averaging.adaptive_tau(norms, self.tau_history)
            self.tau_history = (self.tau_history + norms)[-32:]
        neighbours = [w for w, _ in models.values()]
        self.weights = averaging.clipped_update(self.weights, neighbours, tau)
