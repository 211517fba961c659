"""Who is out there: seeds, peer exchange, suspicion, drop and re-admission.

No global view and no coordinator. Each peer keeps a table of members it heard of, fed by
its seeds, by ``peers`` lists piggybacked on every exchange, and by whoever contacts it. A
member that misses a deadline is *suspect* (still picked, after alive ones); after
``drop_after`` consecutive misses it is *dead*: its socket is closed and it is no longer
picked. It is re-admitted when it contacts us directly, answers a probe, or when another peer
reports it at a round later than the one it had when we dropped it (it made progress since,
so it is alive). A peer that said ``bye`` is *left* and comes back only by contacting us.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from fedweave.gossip.wire import (
    MAX_PEERS_PER_MESSAGE,
    PeerEntry,
    dialable_addr,
    valid_addr,
    valid_peer_id,
)

ALIVE, SUSPECT, DEAD, LEFT = "alive", "suspect", "dead", "left"


@dataclass
class Member:
    """What this peer knows about another one."""

    peer_id: str
    addr: str
    round: int = 0
    state: str = ALIVE
    misses: int = 0
    dropped_at_round: int = -1
    done: bool = False
    """Its last direct message said its rounds are over (it only answers, lingering)."""
    heard_at: float = 0.0
    """``time.monotonic()`` of its last direct message (0: only heard of through others)."""
    suspect_since: float = 0.0
    """``time.monotonic()`` when it last became suspect."""
    refuses_us: bool = False
    """Its CURVE handshake refused our key: never chosen until it contacts us itself."""


class Membership:
    """The member table of one peer.

    Args:
        self_id / self_addr: this peer (never added as a member of itself).
        drop_after: consecutive missed deadlines before a member is dropped (default 3;
            1 miss already makes it suspect).
        max_members: cap on the table, so a flood of fake peer lists cannot grow it without
            bound (default 4096).
        rng: randomness for neighbour choice (seed it for repeatable runs).
    """

    def __init__(
        self,
        self_id: str,
        self_addr: str,
        drop_after: int = 3,
        max_members: int = 4096,
        rng: random.Random | None = None,
    ) -> None:
        self.self_id = self_id
        self.self_addr = self_addr
        self.drop_after = max(1, drop_after)
        self.max_members = max_members
        self.rng = rng or random.Random()
        self.members: dict[str, Member] = {}
        self.allowed_ids: set[str] | None = None
        """With CURVE: only ids whose keys we hold can be members (we could not talk to others)."""

    # -- learning about peers -----------------------------------------------------------

    def heard_from(self, peer_id: str, addr: str, round_: int, done: bool = False) -> bool:
        """Direct contact: the peer is alive. Returns True when it is new or re-admitted."""
        if peer_id == self.self_id or not self._acceptable(peer_id, addr):
            return False
        now = time.monotonic()
        member = self.members.get(peer_id)
        if member is None:
            if len(self.members) >= self.max_members:
                return False
            self.members[peer_id] = Member(peer_id, addr, round_, done=done, heard_at=now)
            return True
        came_back = member.state in (DEAD, LEFT) or member.refuses_us
        member.addr = addr or member.addr
        member.round = max(member.round, round_)
        member.state, member.misses = ALIVE, 0
        member.done, member.heard_at, member.refuses_us = done, now, False
        return came_back

    def duplicate(self, peer_id: str, addr: str, within: float) -> str | None:
        """The other address of ``peer_id`` when a live member with that id spoke to us from
        an address other than ``addr`` in the last ``within`` seconds: two processes hold one
        key pair (one id, two live addresses). ``None`` otherwise."""
        member = self.members.get(peer_id)
        if member is None or not addr or not member.addr or member.addr == addr:
            return None
        fresh = member.heard_at and time.monotonic() - member.heard_at < within
        return member.addr if fresh and member.state in (ALIVE, SUSPECT) else None

    def refused_our_key(self, peer_id: str) -> None:
        """``peer_id``'s CURVE handshake refused our key: stop choosing it (it is not dead,
        so no missed deadlines are counted; a message from it re-admits it)."""
        member = self.members.get(peer_id)
        if member is not None:
            member.refuses_us = True

    def merge(self, entries: list[PeerEntry]) -> list[str]:
        """Fold a gossiped peer list in; return ids that are new or re-admitted."""
        changed = []
        for entry in entries:
            if entry.peer_id == self.self_id or not self._acceptable(entry.peer_id, entry.addr):
                continue
            member = self.members.get(entry.peer_id)
            if member is None:
                if len(self.members) >= self.max_members:
                    continue
                self.members[entry.peer_id] = Member(entry.peer_id, entry.addr, entry.round)
                changed.append(entry.peer_id)
            elif member.state == DEAD and entry.round > member.dropped_at_round:
                member.state, member.misses, member.addr = ALIVE, 0, entry.addr
                member.round = entry.round
                changed.append(entry.peer_id)
            elif member.state != LEFT:
                member.round = max(member.round, entry.round)
        return changed

    def is_member(self, peer_id: str) -> bool:
        """Whether ``peer_id`` may get our model: with CURVE, a key on the allow-list (a key
        costs an operator's decision); without, a peer already in the table (introduced by a
        ``hello`` or a peer list, not by the offer itself) that did not leave."""
        if self.allowed_ids is not None:
            return peer_id in self.allowed_ids
        member = self.members.get(peer_id)
        return member is not None and member.state != LEFT

    def _acceptable(self, peer_id: str, addr: str) -> bool:
        if not valid_peer_id(peer_id) or (addr and not valid_addr(addr)):
            return False
        return self.allowed_ids is None or peer_id in self.allowed_ids

    # -- failures -------------------------------------------------------------------------

    def missed(self, peer_id: str) -> str:
        """A deadline passed without an answer (or its connection was lost); returns the
        member's new state. A suspect is no longer chosen for exchanges (so its partners pay
        at most this one deadline); ``tick_suspects`` says ``hello`` to it each round and
        drops it after ``drop_after`` rounds without a word."""
        member = self.members.get(peer_id)
        if member is None:
            return DEAD
        member.misses += 1
        if member.misses >= self.drop_after:
            self._drop(member)
        elif member.state == ALIVE:
            member.state = SUSPECT
            member.suspect_since = time.monotonic()
        return member.state

    def _drop(self, member: Member) -> None:
        if member.state != DEAD:
            member.dropped_at_round = member.round
        member.state = DEAD

    def tick_suspects(self, quiet_s: float = 0.0) -> tuple[list[str], list[str]]:
        """Once a round: (suspects to greet, suspects dropped now). A suspect that said
        nothing since it became suspect counts one more miss; at ``drop_after``, and once
        it has been silent ``quiet_s`` seconds (fast rounds must not drop a peer that is
        only slow for a moment), it is dropped (probed every few rounds from then on, like
        any dropped member)."""
        greet, dropped = [], []
        now = time.monotonic()
        for member in self.members.values():
            if member.state != SUSPECT:
                continue
            if member.heard_at > member.suspect_since:  # it spoke since: alive after all
                member.state, member.misses = ALIVE, 0
                continue
            member.misses += 1
            if member.misses >= self.drop_after and now - member.suspect_since >= quiet_s:
                self._drop(member)
                dropped.append(member.peer_id)
            else:
                greet.append(member.peer_id)
        return greet, dropped

    def left(self, peer_id: str) -> None:
        """The peer said ``bye``."""
        member = self.members.get(peer_id)
        if member is not None:
            member.state = LEFT
            member.dropped_at_round = member.round

    # -- choosing -------------------------------------------------------------------------

    def live(self) -> list[Member]:
        return [
            m for m in self.members.values() if m.state in (ALIVE, SUSPECT) and not m.refuses_us
        ]

    def still_training(self, since: float, quiet_s: float) -> list[Member]:
        """Live members that have not said their rounds are over and were heard from in
        the last ``quiet_s`` seconds (counting from ``since`` at the earliest): the peers a
        lingering peer still answers for. One that went quiet (killed, cut off) is not
        waited for."""
        cutoff = time.monotonic() - quiet_s
        return [m for m in self.live() if not m.done and max(m.heard_at, since) > cutoff]

    def pick(self, k: int) -> list[Member]:
        """Up to ``k`` random alive members we can dial (a suspect is greeted, not chosen,
        until it answers; a member without a dialable ``addr`` is never a neighbour:
        PROTOCOL.md §4)."""
        alive = [m for m in self.live() if dialable_addr(m.addr) and m.state == ALIVE]
        self.rng.shuffle(alive)
        return alive[: max(0, k)]

    def probe_candidates(self, k: int) -> list[Member]:
        """Up to ``k`` dropped members to re-try (they may be back)."""
        dead = [m for m in self.members.values() if m.state == DEAD]
        self.rng.shuffle(dead)
        return dead[:k]

    def sample_entries(self, own_round: int, n: int = 16) -> list[PeerEntry]:
        """This peer plus up to ``n - 1`` random live members, for piggybacking."""
        live = self.live()
        self.rng.shuffle(live)
        n = min(n, MAX_PEERS_PER_MESSAGE)
        entries = [PeerEntry(self.self_id, self.self_addr, own_round)]
        entries += [PeerEntry(m.peer_id, m.addr, m.round) for m in live[: n - 1] if m.addr]
        return entries

    def counts(self) -> dict[str, int]:
        out = {ALIVE: 0, SUSPECT: 0, DEAD: 0, LEFT: 0}
        for m in self.members.values():
            out[m.state] += 1
        return out
