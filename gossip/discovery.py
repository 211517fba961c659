"""Talking to the members: connections, ``hello``/``peers``, probes and ``bye``.

The member table (``fedweave.gossip.membership``) says who is out there; this part keeps in
touch with them. It opens a DEALER to a member on first use (pinning its CURVE key), says
``hello`` with a sample of the table, answers a ``hello`` with a larger sample, learns from the
sender and the peer list of every message (greeting the peers it had not heard of), re-keys a
seed's DEALER once the seed's id is known, probes dropped members and says ``bye`` to everyone
on leaving. Nothing here waits: it only queues messages.
"""

from __future__ import annotations

import logging

from fedweave.errors import UserError
from fedweave.gossip import wire
from fedweave.gossip.keys import KeyRing
from fedweave.gossip.membership import SUSPECT, Membership
from fedweave.gossip.state import PeerState
from fedweave.gossip.transport import Incoming, Transport

log = logging.getLogger("fedweave.gossip")

SEED_PREFIX = "seed:"
"""DEALER keys of seeds whose peer id is not known yet: ``seed:ADDR``, or with CURVE and no id
given ``seed:ADDR#PEERID`` (one per key tried). ``take_peers`` re-keys them by peer id."""


class Discovery:
    """Connections to members and the membership traffic of one peer.

    Args:
        state: this peer (id, address and round go into every message).
        members: the member table it reads and updates.
        transport: the peer's sockets.
        keyring: CURVE identity and allow-list, or ``None`` for plaintext.
    """

    def __init__(
        self,
        state: PeerState,
        members: Membership,
        transport: Transport,
        keyring: KeyRing | None,
    ) -> None:
        self.state = state
        self.members = members
        self.transport = transport
        self.keyring = keyring
        self.greeted: set[str] = set()

    def connect(self, peer_id: str) -> bool:
        """Make sure there is a DEALER to member ``peer_id``; ``False`` if there cannot be one
        (unknown member, no address, or with CURVE no key for it)."""
        member = self.members.members.get(peer_id)
        if member is None or not member.addr:
            return False
        if not self.transport.connected(peer_id):
            key = self.keyring.allowed.get(peer_id) if self.keyring else None
            if self.keyring is not None and key is None:
                return False
            self.transport.connect(peer_id, member.addr, key)
        return True

    def hello(self, keys: list[str]) -> None:
        """Say ``hello`` (with a sample of our members) to members or seed DEALERs ``keys``."""
        for key in keys:
            if not key.startswith(SEED_PREFIX) and not self.connect(key):
                continue
            msg = self.state.message(
                wire.HELLO, peers=self.members.sample_entries(self.state.round, 8)
            )
            self.transport.send(key, wire.encode(msg))
            self.greeted.add(key)

    def probe(self, k: int) -> None:
        """Say ``hello`` to up to ``k`` dropped members: an answer re-admits them."""
        self.hello([m.peer_id for m in self.members.probe_candidates(k)])

    # -- what every message tells us -----------------------------------------------------

    def learn(self, msg: wire.Message) -> None:
        """The sender is alive, and so are the peers it lists: greet the ones new to us."""
        known = self.members.members.get(msg.sender)
        was = None if known is None else ("refusing our key" if known.refuses_us else known.state)
        if self.members.heard_from(msg.sender, msg.addr, msg.round, msg.done) or was == SUSPECT:
            if was is None:
                log.info("peer %s is live (%s)", msg.sender, msg.addr)
            else:
                log.info("peer %s is back (%s; was %s)", msg.sender, msg.addr, was)
        for new in self.members.merge(msg.peers)[:8]:
            if new not in self.greeted:
                self.hello([new])

    def answer_hello(self, inc: Incoming, msg: wire.Message) -> None:
        """A ``hello`` on the inbox: answer ``peers`` with a larger sample of our members."""
        answer = self.state.message(
            wire.PEERS, peers=self.members.sample_entries(self.state.round, 32)
        )
        self.transport.reply(inc.route or b"", wire.encode(answer))

    def refuse_hello(self, inc: Incoming, reason: str) -> None:
        """Answer a ``hello`` with a ``peers`` message that carries why we will not take its
        sender as a member (PROTOCOL.md §4), and no peer list."""
        answer = self.state.message(wire.PEERS, reason=reason)
        self.transport.reply(inc.route or b"", wire.encode(answer))

    def take_peers(self, inc: Incoming, msg: wire.Message) -> None:
        """A ``peers`` answer: if it came through a seed's DEALER, we now know the seed's id.
        One that carries a ``reason`` refused us (a duplicate key): that ends this peer."""
        if msg.reason:
            raise UserError(f"peer {msg.sender} ({msg.addr}) refuses this peer: {msg.reason}")
        if inc.neighbour is not None and inc.neighbour.startswith(SEED_PREFIX):
            self.transport.rename(inc.neighbour, msg.sender)

    def left(self, peer_id: str) -> None:
        """``peer_id`` said ``bye``: mark it left and close its DEALER."""
        self.members.left(peer_id)
        self.transport.disconnect(peer_id)

    # -- leaving ------------------------------------------------------------------------

    def say_bye(self) -> None:
        """Say ``bye`` to every peer we know (not only those we have sockets to), so nobody
        waits out a deadline on us."""
        bye = wire.encode(self.state.message(wire.BYE))
        keys = {k for k in self.transport.neighbour_keys() if not k.startswith(SEED_PREFIX)}
        keys |= {m.peer_id for m in self.members.live()}
        for key in sorted(keys):
            if self.connect(key) or self.transport.connected(key):
                self.transport.send(key, list(bye))
