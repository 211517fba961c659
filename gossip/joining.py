"""Joining the network: hello to the seeds until one answers, then (a late joiner) pull the
current model from live peers instead of starting from scratch."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedweave.config import RunConfig
from fedweave.errors import UserError
from fedweave.gossip import averaging, wire
from fedweave.gossip.discovery import SEED_PREFIX, Discovery
from fedweave.gossip.exchange import Exchange
from fedweave.gossip.inbox import Inbox
from fedweave.gossip.keys import DEFAULT_KEYS_DIR, KeyRing
from fedweave.gossip.membership import Membership
from fedweave.gossip.state import PeerState
from fedweave.gossip.transport import Transport, wait_until

log = logging.getLogger("fedweave.gossip")

HANDSHAKE_FAILURES = 3
"""Failed CURVE handshakes with each of a seed's pinned keys before joining gives up on it."""
FAILING_FOR_S = 2.0
"""...and for at least this long (a seed starting up fails a handshake or two)."""


class Joining:
    """How one peer enters the network.

    Args:
        config: ``seeds``, ``wait_for_peers``, ``mix`` and ``keys`` (for error messages).
        state: this peer; a catch-up replaces its weights and round.
        keyring: CURVE identity and allow-list (seed keys), or ``None`` for plaintext.
        transport: opens and closes the seeds' DEALERs.
        members: the member table the seeds' answers fill.
        discovery: says ``hello``.
        exchange: pulls models for the catch-up.
        inbox: where every wait serves what arrives.
        stopping: true once the peer was asked to stop; waits then return.
    """

    def __init__(
        self,
        config: RunConfig,
        state: PeerState,
        keyring: KeyRing | None,
        transport: Transport,
        members: Membership,
        discovery: Discovery,
        exchange: Exchange,
        inbox: Inbox,
        stopping: Callable[[], bool],
    ) -> None:
        self.config = config
        self.state = state
        self.keyring = keyring
        self.transport = transport
        self.members = members
        self.discovery = discovery
        self.exchange = exchange
        self.inbox = inbox
        self.stopping = stopping
        self._first_failure: dict[str, float] = {}

    def join(self, timeout: float) -> None:
        """Say hello to the seeds until one answers (``UserError`` naming them after
        ``--seed-timeout``), then wait until ``--wait-for-peers`` peers are live, saying so;
        both within ``timeout`` seconds (``UserError`` if too few peers came)."""
        started = time.monotonic()
        deadline = started + timeout
        addr = self.state.addr
        listed = self.config.peer.seeds.split(",")
        seeds = [s.strip() for s in listed if s.strip() and s.strip() != addr]
        if seeds:
            self._open_seeds(seeds)
            seed_deadline = min(deadline, started + self.config.gossip.seed_timeout)
            backoff, next_try, tries = 0.5, 0.0, 0
            while not self.members.live() and not self.stopping():
                self._refuse_on_mechanism_mismatch(seeds)
                self._refuse_if_no_seed_key_works(seeds)
                now = time.monotonic()
                if now >= seed_deadline:
                    raise UserError(self._no_seed_answered(seeds, now - started))
                if now >= next_try:
                    if tries:
                        log.warning("no seed answered yet; retrying in %.1fs", backoff)
                    self.discovery.hello(
                        [k for k in self.transport.neighbour_keys() if k.startswith(SEED_PREFIX)]
                    )
                    next_try, backoff, tries = now + backoff, min(backoff * 2, 5.0), tries + 1
                self.inbox.serve(min(0.1, wait_until(seed_deadline)))
            for key in self.transport.neighbour_keys():
                if key.startswith(SEED_PREFIX):  # a seed's DEALER renamed to its id stays
                    self.transport.disconnect(key)
        self._wait_for_peers(deadline, timeout)

    def _wait_for_peers(self, deadline: float, timeout: float) -> None:
        """Before round 1, wait until ``--wait-for-peers`` peers (this one included) are
        live: a peer that started first must not run its rounds alone (PROTOCOL.md §7)."""
        want = self.config.gossip.wait_for_peers - 1
        if len(self.members.live()) >= want or self.stopping():
            return
        log.info(
            "waiting for %d more peer(s) before round 1 (--wait-for-peers %d; at most %gs, "
            "--connect-timeout)",
            want - len(self.members.live()), want + 1, timeout,
        )  # fmt: skip
        next_hello, next_note = 0.0, time.monotonic() + 30.0
        while len(self.members.live()) < want and not self.stopping():
            now = time.monotonic()
            if now >= deadline:
                live = len(self.members.live())
                raise UserError(
                    f"only {live + 1} of --wait-for-peers {want + 1} peers live after "
                    f"{timeout:g}s: start the others with --seeds {self.state.addr} (or raise "
                    "--connect-timeout; --wait-for-peers 1 trains alone)"
                )
            if now >= next_note:
                log.info("still waiting: %d of %d peers live", len(self.members.live()) + 1,
                         want + 1)  # fmt: skip
                next_note = now + 30.0
            if now >= next_hello:
                self.discovery.hello([m.peer_id for m in self.members.pick(2)])
                next_hello = now + 0.3
            self.inbox.serve(min(0.05, wait_until(deadline)))
        if self.members.live():
            log.info("%d peer(s) live: starting round 1", len(self.members.live()) + 1)

    def _no_seed_answered(self, seeds: list[str], waited: float) -> str:
        """Why no seed answered, per seed: nothing listens there, or it is silent."""
        parts = []
        for spec in seeds:
            addr = spec.rpartition("@")[2]
            keys = self._seed_keys(addr)
            refused = any(self.transport.connect_refused(k) for k in keys)
            connected = any(self.transport.connected_once(k) for k in keys)
            if connected:
                parts.append(f"{addr} accepted the connection but never answered")
            elif refused:
                parts.append(f"{addr} refuses connections (no peer listens there)")
            else:
                parts.append(f"{addr} cannot be reached")
        return (
            f"no seed answered within {waited:.0f}s: {'; '.join(parts)}; check --seeds and "
            "that a peer runs there (--seed-timeout waits longer)"
        )

    def _seed_keys(self, addr: str) -> list[str]:
        """The DEALER keys opened for the seed at ``addr``."""
        return [
            k for k in self.transport.neighbour_keys()
            if k == f"{SEED_PREFIX}{addr}" or k.startswith(f"{SEED_PREFIX}{addr}#")
        ]  # fmt: skip

    def _refuse_on_mechanism_mismatch(self, seeds: list[str]) -> None:
        """A plaintext peer dialling a CURVE seed, or the other way round, fails every
        handshake with a mechanism mismatch: say which, at once (``UserError``)."""
        for spec in seeds:
            addr = spec.rpartition("@")[2]
            if not any(self.transport.mechanism_mismatch(k) for k in self._seed_keys(addr)):
                continue
            if self.keyring is None:
                raise UserError(
                    f"seed {addr} speaks CURVE and this peer plaintext (--insecure): drop "
                    "--insecure and exchange keys with that site (docs/gossip.md)"
                )
            raise UserError(
                f"seed {addr} runs plaintext (--insecure) and this peer CURVE: start every "
                "peer the same way (without --insecure, and keys exchanged)"
            )

    def _refuse_if_no_seed_key_works(self, seeds: list[str]) -> None:
        """With CURVE, a seed that refused our key, or whose every pinned key failed
        ``HANDSHAKE_FAILURES`` handshakes (none succeeding), will not answer however long we
        retry: when that is every seed, say why now (``UserError``) instead of waiting out
        ``--connect-timeout``."""
        if self.keyring is None:
            return
        refused, failed = [], []
        for spec in seeds:
            addr = spec.rpartition("@")[2]
            counts = [self.transport.handshakes(k) for k in self._seed_keys(addr)]
            if not counts or any(ok for _, ok, _ in counts):
                continue
            if any(no for _, _, no in counts):
                refused.append(spec)
            elif all(f >= HANDSHAKE_FAILURES for f, _, _ in counts) and self._failing_for(spec):
                failed.append(spec)
        if not seeds or len(refused) + len(failed) < len(seeds):
            return
        self._refuse_on_mechanism_mismatch(seeds)  # failures that came with a mismatch
        keys = self._keys_dir()
        if refused:
            raise UserError(
                f"seed {', '.join(refused)} refuses this peer's key: copy {keys}/peer.key into "
                "its allowed/ (and restart it)"
            )
        named = [spec for spec in failed if "@" in spec]
        if named:
            raise UserError(
                f"every CURVE handshake with seed {', '.join(named)} fails: the peer there "
                f"does not hold the key given for that id in {keys}/allowed/ (check the id "
                "before @)"
            )
        raise UserError(
            f"every CURVE handshake with seed {', '.join(failed)} fails: none of the "
            f"{len(self.keyring.allowed) - 1} key(s) in {keys}/allowed/ is the key of the peer "
            "there; copy its peer.key in with `fedweave keys allow FILE`"
        )

    def _failing_for(self, spec: str) -> bool:
        """Handshakes with seed ``spec`` have failed for ``FAILING_FOR_S`` seconds: a wrong
        key fails every retry, a seed that is only starting up (or a plaintext one, whose
        mechanism mismatch the monitor reports a moment later) does not look like one."""
        now = time.monotonic()
        first = self._first_failure.setdefault(spec, now)
        return now - first >= FAILING_FOR_S

    def _keys_dir(self) -> Path:
        """The key directory this peer runs with (``--keys``, or the default one)."""
        return self.config.peer.keys or DEFAULT_KEYS_DIR

    def _open_seeds(self, seeds: list[str]) -> None:
        for spec in seeds:
            peer_id, _, addr = spec.rpartition("@")
            if not wire.valid_addr(addr):
                raise UserError(f"bad seed '{spec}': use tcp://HOST:PORT or PEERID@tcp://HOST:PORT")
            if self.keyring is None:
                self.transport.connect(f"{SEED_PREFIX}{addr}", addr, watch=True)
            elif peer_id:
                if peer_id not in self.keyring.allowed:
                    raise UserError(
                        f"seed {peer_id} has no public key in {self._keys_dir()}/allowed/"
                    )
                self.transport.connect(
                    f"{SEED_PREFIX}{addr}", addr, self.keyring.allowed[peer_id], watch=True
                )
            else:  # the seed's key is unknown: try every allowed key, the right one answers
                for pid, key in self.keyring.allowed.items():
                    if pid != self.state.peer_id:
                        self.transport.connect(f"{SEED_PREFIX}{addr}#{pid}", addr, key, watch=True)

    def catch_up(self, timeout: float) -> None:
        """A late joiner starts from the network's model instead of from scratch; the pull
        waits at most ``timeout`` seconds. Nothing to do when no live peer is past round 0.

        ``pairwise`` trusts the most advanced live peer. The robust rules pull from three and
        adopt their coordinate-wise median (and the median round), so a single poisoned peer
        claiming to be ahead cannot hand a newcomer its model; with fewer than three answers
        the newcomer keeps its own initial model. With fewer than three live peers ahead there
        is no majority to take a median of: it pulls from them and adopts the model of the one
        that says it is least advanced (and its round), so claiming a higher round wins a liar
        nothing; with one peer ahead that is the only one, as under ``pairwise``.
        """
        ahead = sorted((m for m in self.members.live() if m.round > 0), key=lambda m: -m.round)
        if not ahead:
            return
        want = 1 if self.config.gossip.mix == "pairwise" else min(3, len(ahead))
        pulled = self.exchange.pull([m.peer_id for m in ahead[:want]], timeout)
        if pulled is None:
            return
        if len(pulled) < want:
            log.warning(
                "could not pull the current model from %d live peer(s); starting from "
                "this peer's own initial model",
                want,
            )
            return
        if want < 3:
            round_, model = min(pulled, key=lambda answer: answer[0])
            self.state.weights = OrderedDict((k, np.array(v)) for k, v in model.items())
            self.state.round = round_
        else:
            first, *others = [w for _, w in pulled]
            self.state.weights = averaging.trimmed_mean(first, others, trim_fraction=0.34)
            self.state.round = int(np.median([r for r, _ in pulled]))
        log.info("caught up: pulled the model of %d peer(s) at round %d", want, self.state.round)
