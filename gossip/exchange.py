"""Exchanging models with neighbours: offers, replies, held offers, ``busy``, and the mixing.

``pairwise`` (push-pull): an offer carries our model; the neighbour answers with its current
model and both apply ``averaging.pairwise_update`` as a delta against what was sent, so the
weighted sum ``sum_i n_i x_i`` is exact. Under ``--compress fp16|int8`` both ends take that
delta between the two models as decoded (``wire.as_received``), so the sum stays exact; only
the difference of the two roundings enters each model. With a ``group_total`` the offer is
one of several sent at once and carries a ``share`` (PROTOCOL.md §5). While our own offers
are out (``awaiting``) nothing else is mixed in between: an offer with a larger exchange id
than ours is held and answered as soon as our exchange is done (``answer_held``), one with a
smaller id hears ``busy`` at once, so waits only run from larger to smaller exchange ids and
never form a cycle. The robust rules (``clipped``, ``trimmed``) answer every offer, collect
the models of a round and mix them once (``mix_collected``). A pull offer (a late joiner's
catch-up) asks for a model and mixes nothing. Every wait takes an explicit ``timeout`` and
ends early when the peer stops.

A neighbour's word is bounded, not trusted (``guard.py``): its example count and ``share``
are capped relative to ours, a model too far from ours is refused (an offer is answered
``refused``, a reply is not mixed) and counted as a drop, and an offer from a peer that is not
a member (not on the CURVE allow-list; without CURVE, not introduced by a ``hello`` or a peer
list) gets a ``refused`` answer, never our model.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from fedweave.config import RunConfig
from fedweave.config.rules import gossip_compression_problem
from fedweave.errors import UserError
from fedweave.gossip import averaging, wire
from fedweave.gossip.discovery import Discovery
from fedweave.gossip.guard import DistanceGuard, capped_share, counted_examples
from fedweave.gossip.inbox import Inbox
from fedweave.gossip.keys import DEFAULT_KEYS_DIR
from fedweave.gossip.membership import Membership
from fedweave.gossip.state import PeerState
from fedweave.gossip.transport import Transport, wait_until
from fedweave.learning.compression import Compression

log = logging.getLogger("fedweave.gossip")

MAX_DEFERRED = 16
"""Offers held back while our own offer is out; past that (or a second one from the same
sender) the answer is ``busy``, so a flood of offers cannot pile up models in memory."""
MAX_HOLD_FRACTION = 0.25
"""A held offer waits at most this fraction of ``--exchange-timeout``, then hears ``busy``:
a peer stuck waiting on a slow or dead neighbour never makes its own offerers miss their
deadlines, so one bad peer costs only its direct partners."""


def gossip_encoding(compress: str) -> str:
    """The wire encoding (``wire.ENCODINGS``) of ``--compress`` for gossip: ``none`` is
    ``raw``; ``fp16`` and ``int8`` are themselves; anything else is refused with the options'
    rule (``fedweave/config/rules.py``: peers send whole models, and most of a model's values
    are not small)."""
    problem = gossip_compression_problem(compress)
    if problem is not None:
        raise UserError(problem)
    kind = Compression.parse(compress).kind
    return "raw" if kind == "none" else kind


@dataclass
class _Pending:
    """An offer of ours still waiting for its reply."""

    peer_id: str
    snapshot: OrderedDict[str, np.ndarray]
    expires: float
    pull: bool = False
    group_total: int | None = None
    radius: float = math.inf
    """The radius our offer carried (``DistanceGuard.radius``): the reply's scale obeys it."""


class Exchange:
    """Both sides of model exchanges: the offers we send and the offers we answer.

    Args:
        config: ``mix``, ``exchange_timeout`` (late replies are applied until 3 times it),
            ``trim_fraction`` and ``clip_tau``.
        state: this peer's model, mixed in place of ``state.weights``.
        members: the member table (a sample rides along on every offer and reply).
        transport: the peer's sockets.
        discovery: opens the DEALER to a neighbour before the first offer.
        inbox: where waiting for replies serves everything else that arrives.
        stopping: true once the peer was asked to stop; waits then return.
    """

    def __init__(
        self,
        config: RunConfig,
        state: PeerState,
        members: Membership,
        transport: Transport,
        discovery: Discovery,
        inbox: Inbox,
        stopping: Callable[[], bool],
    ) -> None:
        self.config = config
        self.encoding = gossip_encoding(config.federation.compress)
        self.state = state
        self.members = members
        self.transport = transport
        self.discovery = discovery
        self.inbox = inbox
        self.stopping = stopping
        self.pending: dict[int, _Pending] = {}
        self.awaiting: set[int] = set()
        """Exchange ids of our offers out right now: offers from others are held meanwhile."""
        self.deferred: list[tuple[bytes, wire.Message, float]] = []  # (route, offer, held at)
        self.outcomes: dict[int, str] = {}
        self.known_n: dict[str, int] = {}
        """Example counts neighbours sent with their models (group exchanges need them)."""
        self.buffered: dict[str, tuple[OrderedDict[str, np.ndarray], int]] = {}
        self.replies: list[tuple[str, OrderedDict[str, np.ndarray], int]] = []
        self.pulled: list[tuple[int, OrderedDict[str, np.ndarray]]] = []
        self.tau_history: list[float] = []
        self.busy_replies = 0
        self.refusals = 0
        self.refused_by: set[str] = set()
        """Peers whose refusal was logged (once each: a misconfigured peer is told once)."""
        self.mixes = 0
        self.guard = DistanceGuard(config.gossip.distance_factor)
        self.warned: set[tuple[str, str]] = set()
        """(peer, reason) pairs already logged: each refusal reason once per neighbour."""
        self.schema_refused: dict[str, str] = {}
        """Peers that refused our model for its schema, with their reason (when every live
        peer does, this peer can learn with nobody: ``Peer`` stops it)."""
        self.distances: list[float] = []
        """Distances to the models accepted since ``take_distances`` (consensus estimate)."""
        self.key_refusals: set[str] = set()
        """Peers whose CURVE handshake refused our key (each said once)."""

    def take_distances(self) -> list[float]:
        """The distances collected since the last call (bounded: a round's exchanges)."""
        taken, self.distances = self.distances[-1000:], []
        return taken

    def _counted(self, claimed: int) -> int:
        """A neighbour's example count as we weigh it (``guard.counted_examples``)."""
        return counted_examples(claimed, self.state.num_examples, self.config.gossip.example_ratio)

    def _refused_model(self, sender: str, reason: str, detail: str) -> None:
        """Count a model we would not mix like a drop (per reason) and log it once per
        neighbour and reason."""
        self.inbox.drops[reason] += 1
        if (sender, reason) not in self.warned:
            self.warned.add((sender, reason))
            if len(self.warned) > 10_000:
                self.warned.clear()
            log.warning("refused the model of %s: %s", sender, detail)

    # -- our offers ----------------------------------------------------------------------

    def knows_size_of(self, peer_id: str) -> bool:
        """Whether ``peer_id`` has sent us its example count (with a model) yet."""
        return peer_id in self.known_n

    def group_total(self, peer_ids: list[str]) -> int:
        """Examples in a group exchange with ``peer_ids``: ours plus their last known counts."""
        return self.state.num_examples + sum(self.known_n[pid] for pid in peer_ids)

    def exchange(
        self, peer_ids: list[str], timeout: float, group_total: int | None = None
    ) -> dict[str, str]:
        """Offer our model to ``peer_ids`` at once, wait up to ``timeout`` seconds for their
        replies (holding or refusing other offers meanwhile), then answer the held offers.

        Returns each peer's outcome: ``ok``, ``busy``, ``refused``, ``left`` (said bye meanwhile),
        ``key-refused`` (its CURVE handshake refused our key), ``lost`` (its connection went
        down while we waited: counted as a miss), ``connecting`` (the offer could
        not be sent on a connection still being made), ``unsent`` (could not be sent) or
        ``missed`` (no answer in time).
        """
        xids = {pid: self.offer(pid, group_total=group_total) for pid in peer_ids}
        self.awaiting = {x for x in xids.values() if x}
        self.wait_for(self.awaiting, timeout)
        self.awaiting = set()
        self.answer_held()
        outcomes = {
            pid: (self.outcomes.pop(xid, None) or "missed") if xid else "unsent"
            for pid, xid in xids.items()
        }
        for pid, outcome in outcomes.items():  # an offer that could not even be sent
            if outcome in ("unsent", "missed") and self._refuses_our_key(pid):
                outcomes[pid] = "key-refused"
            elif outcome == "unsent" and self.transport.connecting(pid, timeout):
                outcomes[pid] = "connecting"  # a fresh connection: not a miss
        return outcomes

    def pull(self, peer_ids: list[str], timeout: float) -> list[tuple[int, OrderedDict]] | None:
        """Ask ``peer_ids`` for their models without mixing; wait up to ``timeout`` seconds.

        Returns the (round, model) of those that answered in time, ``None`` if the peer was
        asked to stop meanwhile.
        """
        xids = [x for x in (self.offer(pid, pull=True) for pid in peer_ids) if x]
        self.pulled = []
        if not self.wait_for(xids, timeout):
            return None
        for xid in xids:
            self.pending.pop(xid, None)
        pulled, self.pulled = self.pulled, []
        return pulled

    def drain(self, timeout: float) -> None:
        """After the last round, apply replies still in flight (keeps the average exact)."""
        self.wait_for(list(self.pending), timeout)

    def offer(self, peer_id: str, pull: bool = False, group_total: int | None = None) -> int:
        """Send our model (or a pull request) to ``peer_id``; returns the exchange id, 0 if
        the send failed (counts as a miss)."""
        if not self.discovery.connect(peer_id):
            return 0
        xid = random.getrandbits(62) + 1
        state = self.state
        snapshot = state.weights
        radius = self.guard.radius() if self.config.gossip.mix == "pairwise" else math.inf
        msg = state.message(
            wire.OFFER,
            xid,
            peers=self.members.sample_entries(state.round, 8),
            num_examples=state.num_examples,
            schema=state.schema,
            pull=pull,
            tensors=OrderedDict() if pull else snapshot,
            share=None if group_total is None else state.num_examples / group_total,
            radius=None if pull or not math.isfinite(radius) else radius,
            encoding=self.encoding,
        )
        if not self.transport.send(peer_id, wire.encode(msg)):
            return 0
        expires = time.monotonic() + 3 * self.config.gossip.exchange_timeout
        # mixing is a delta against what the neighbour decoded (exact sum under compression)
        sent = snapshot if pull else wire.as_received(snapshot, self.encoding)
        self.pending[xid] = _Pending(peer_id, sent, expires, pull, group_total, radius)
        return xid

    def wait_for(self, xids: Iterable[int], timeout: float) -> bool:
        """Serve until every exchange in ``xids`` is answered (or its peer left), at most
        ``timeout`` seconds; ``False`` if the peer was asked to stop first."""
        waiting = set(xids)
        deadline = time.monotonic() + timeout
        max_hold = MAX_HOLD_FRACTION * self.config.gossip.exchange_timeout
        while waiting & self.pending.keys() and time.monotonic() < deadline:
            if self.stopping():
                return False
            wait = wait_until(deadline)
            if self.deferred:
                wait = min(wait, max(0.0, self.deferred[0][2] + max_hold - time.monotonic()))
            self.inbox.serve(wait)
            self._release_overdue_holds(max_hold)
            self._end_key_refused(waiting)
            self._end_lost(waiting)
        return True

    def _end_lost(self, xids: set[int]) -> None:
        """Stop waiting on neighbours whose connection went down while we waited (their
        process died, or TCP gave up on a silent host): their reply cannot come, so the miss
        costs no more than the time it took to see it, not a whole deadline."""
        for xid in [x for x in xids if x in self.pending]:
            peer_id = self.pending[xid].peer_id
            if self.transport.lost(peer_id):
                del self.pending[xid]
                self.outcomes[xid] = "lost"

    def _end_key_refused(self, xids: set[int]) -> None:
        """Stop waiting on neighbours whose CURVE handshake refused our key: they never
        answer, and that is a key to exchange, not a dead peer."""
        for xid in [x for x in xids if x in self.pending]:
            if self._refuses_our_key(self.pending[xid].peer_id):
                del self.pending[xid]
                self.outcomes[xid] = "key-refused"

    def _refuses_our_key(self, peer_id: str) -> bool:
        """Whether ``peer_id``'s handshake refused our key; if so it is not chosen again
        until it contacts us, its DEALER is closed, and it is said once."""
        if self.config.connection.insecure or not self.transport.key_refused(peer_id):
            return False
        self.members.refused_our_key(peer_id)
        self.transport.disconnect(peer_id)  # libzmq stops retrying: a fresh one later
        if peer_id not in self.key_refusals and len(self.key_refusals) < 1000:
            self.key_refusals.add(peer_id)
            keys = self.config.peer.keys or DEFAULT_KEYS_DIR
            log.warning(
                "peer %s refuses our key (this peer is %s): copy %s/peer.key into its "
                "allowed/ there (`fedweave keys allow peer.key --keys DIR`) and restart it; "
                "until then it is not chosen",
                peer_id, self.state.peer_id, keys,
            )  # fmt: skip
        return True

    def _release_overdue_holds(self, max_hold: float) -> None:
        """Answer ``busy`` to offers held longer than ``max_hold`` seconds."""
        now = time.monotonic()
        while self.deferred and now - self.deferred[0][2] >= max_hold:
            route, msg, _ = self.deferred.pop(0)
            self._answer(route, msg, "busy")

    def expire(self) -> None:
        """Forget offers whose replies are past 3 times the deadline."""
        now = time.monotonic()
        for xid in [x for x, p in self.pending.items() if p.expires < now]:
            del self.pending[xid]

    def peer_left(self, peer_id: str) -> None:
        """``peer_id`` said ``bye``: it will never answer, so stop waiting for it now."""
        for xid in [x for x, p in self.pending.items() if p.peer_id == peer_id]:
            del self.pending[xid]
            self.outcomes[xid] = "left"

    # -- messages from neighbours --------------------------------------------------------

    def on_offer(self, route: bytes, msg: wire.Message, member: bool = True) -> None:
        """An offer on the inbox: hold it, refuse it (``busy``) or answer it and mix.

        ``member``: whether the sender was a member before this message (``Peer`` asks the
        member table); a non-member hears ``refused`` and never gets our model."""
        if not member:
            detail = "not-a-member: this peer does not know you; join through a seed first"
            self._refused_model(msg.sender, "not-a-member", "not a member of this network")
            self.refuse(route, msg, detail)
            return
        if msg.tensors:
            self.known_n[msg.sender] = self._counted(msg.num_examples)
        state = self.state
        mine = state.weights
        if self.config.gossip.mix == "pairwise" and self.awaiting and not msg.pull:
            # Mixing now would interleave with our own exchange. An offer whose (random)
            # exchange id is larger than every one of ours out waits until ours is done
            # (``answer_held``), the others hear busy: along a chain of held offers the ids
            # fall, so waits never form a cycle, and who waits is a coin toss per exchange,
            # not always the same peer (an order by peer id made the smallest id hear busy
            # on every offer while the others exchanged).
            waiting = {m.sender for _, m, _ in self.deferred}
            if (
                msg.xid > max(self.awaiting)
                and msg.sender not in waiting
                and len(self.deferred) < MAX_DEFERRED
            ):
                self.deferred.append((route, msg, time.monotonic()))
                return
            self._answer(route, msg, "busy")
            return
        if not msg.pull:
            why = self.guard.check(msg.sender, msg.tensors, mine)
            if why is not None:
                self._refused_model(msg.sender, "too-far", why)
                self.refuse(route, msg, why)
                return
            self.distances.append(self.guard.last_distance)
        pairwise = self.config.gossip.mix == "pairwise" and not msg.pull
        sent = wire.as_received(mine, self.encoding) if pairwise else mine  # offerer decoded
        scale = 1.0
        if pairwise:  # both ends take the same part of the move (the sum stays exact)
            radius = min(self.guard.radius(), msg.radius or math.inf)
            distance = (
                self.guard.last_distance
                if self.encoding == "raw"
                else averaging.difference_norm(msg.tensors, sent)
            )
            scale = averaging.bounded_scale(distance, radius)
        reply = state.message(
            wire.REPLY,
            msg.xid,
            peers=self.members.sample_entries(state.round, 8),
            num_examples=state.num_examples,
            schema=state.schema,
            tensors=mine,
            scale=None if scale == 1.0 else scale,
            encoding=self.encoding,
        )
        if not self.transport.reply(route, wire.encode(reply)) or msg.pull:
            return  # no reply went out: do not mix either, so the sum stays exact
        self.mixes += 1
        n_other = self._counted(msg.num_examples)
        if pairwise:
            share = capped_share(msg.share, n_other, state.num_examples)
            if share is None:
                share = averaging.pairwise_share(state.num_examples, n_other)
            state.weights = averaging.pairwise_update(
                mine, sent, msg.tensors, state.num_examples, n_other, share=share * scale
            )
        else:
            self.buffered[msg.sender] = (msg.tensors, n_other)

    def refuse(self, route: bytes, msg: wire.Message, reason: str) -> None:
        """Answer an offer we will not take with ``refused`` and why (PROTOCOL.md §4)."""
        self._answer(route, msg, "refused", reason)

    def _answer(self, route: bytes, msg: wire.Message, status: str, reason: str = "") -> None:
        """A reply without a model: ``busy`` or ``refused`` (with ``reason``)."""
        state = self.state
        answer = state.message(
            wire.REPLY,
            msg.xid,
            num_examples=state.num_examples,
            schema=state.schema,
            status=status,
            reason=reason,
        )
        self.transport.reply(route, wire.encode(answer))

    def answer_held(self) -> None:
        """Answer the offers held back while our own exchange was out (call with
        ``awaiting`` empty: they are then served, one atomic exchange each)."""
        deferred, self.deferred = self.deferred, []
        for route, msg, _ in deferred:
            self.on_offer(route, msg)

    def on_reply(self, msg: wire.Message) -> None:
        """A reply to one of our offers: mix it in (or keep it for the round's robust mix)."""
        pending = self.pending.get(msg.xid)
        if pending is None or pending.peer_id != msg.sender:
            raise wire.WireError("stale-reply", f"xid {msg.xid}")
        del self.pending[msg.xid]
        if msg.xid in self.awaiting:
            self.outcomes[msg.xid] = msg.status
        if msg.status == "busy":
            self.busy_replies += 1  # alive but mid-exchange: skip it this round, no miss
            return
        if msg.status == "refused":
            self.refusals += 1  # a valid answer (PROTOCOL.md §4): no mix, no drop, no miss
            if msg.reason.startswith("duplicate-id"):
                raise UserError(f"peer {msg.sender} ({msg.addr}) refuses this peer: {msg.reason}")
            if msg.reason.startswith(("schema-mismatch", "start-mismatch")):
                self.schema_refused[msg.sender] = msg.reason
            if msg.sender not in self.refused_by:
                self.refused_by.add(msg.sender)
                log.warning(
                    "peer %s refused our model: %s", msg.sender, msg.reason or "no reason given"
                )
            return
        if not msg.tensors:
            raise wire.WireError("malformed", "an ok reply without tensors")
        n_other = self._counted(msg.num_examples)
        self.known_n[msg.sender] = n_other
        # a pull is compared with our fresh model, which says nothing of the network's spread
        why = self.guard.check(msg.sender, msg.tensors, pending.snapshot, record=not pending.pull)
        if why is not None:
            self._refused_model(msg.sender, "too-far", why)
            return
        if not pending.pull:
            self.distances.append(self.guard.last_distance)
        if pending.pull:
            self.pulled.append((msg.round, msg.tensors))  # the joiner decides what to adopt
        elif self.config.gossip.mix == "pairwise":
            self.mixes += 1
            if pending.group_total:
                share = min(1.0, n_other / pending.group_total)
            else:
                share = averaging.pairwise_share(self.state.num_examples, n_other)
            # the part of the move the neighbour took, never more than our radius allows
            scale = min(
                msg.scale or 1.0, averaging.bounded_scale(self.guard.last_distance, pending.radius)
            )
            share *= scale
            self.state.weights = averaging.pairwise_update(
                self.state.weights,
                pending.snapshot,
                msg.tensors,
                self.state.num_examples,
                n_other,
                share,
            )
        else:
            self.replies.append((msg.sender, msg.tensors, n_other))

    # -- the robust rules: one mix per round ---------------------------------------------

    def discard_late_replies(self) -> None:
        """A new round starts: replies collected since the last mix are too old to use."""
        self.replies = []

    def mix_collected(self) -> None:
        """``clipped`` / ``trimmed``: one mix per round over replies and offers received."""
        if self.config.gossip.mix == "pairwise":
            return
        models = {pid: (w, n) for pid, w, n in self.replies}
        replied = len(set(models) - set(self.buffered))  # offers were counted when answered
        models.update(self.buffered)
        self.buffered, self.replies = {}, []
        if not models:
            return
        current = self.state.weights
        if self.config.gossip.mix == "trimmed":
            if len(models) >= 2:  # fewer: trimmed_mean keeps our model
                self.mixes += replied
            self.state.weights = averaging.trimmed_mean(
                current, [w for w, _ in models.values()], self.config.gossip.trim_fraction
            )
            return
        norms = [averaging.difference_norm(w, current) for w, _ in models.values()]
        tau = self.config.gossip.clip_tau
        if tau is None:
            tau = averaging.adaptive_tau(norms, self.tau_history)
            self.tau_history = (self.tau_history + norms)[-32:]
        self.mixes += replied
        neighbours = [w for w, _ in models.values()]
        counts = [self.state.num_examples, *(n for _, n in models.values())]
        self.state.weights = averaging.clipped_update(current, neighbours, tau, counts)
