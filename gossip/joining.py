"""Joining the network: hello to the seeds until one answers, then (a late joiner) pull the
current model from live peers instead of starting from scratch."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

import numpy as np

from fedweave.errors import UserError
from fedweave.gossip import averaging, wire
from fedweave.gossip.node import SEED_PREFIX, Node
from fedweave.gossip.transport import wait_until

log = logging.getLogger("fedweave.gossip")


class JoiningNode(Node):
    """A ``Node`` that can join through seeds and catch up; ``gossip.peer.Peer`` runs it."""

    def _join(self) -> None:
        """Say hello to the seeds until one answers, then pull the model if we are late."""
        deadline = time.monotonic() + self.config.connect_timeout
        seeds = [s.strip() for s in self.config.seeds if s.strip() and s.strip() != self.addr]
        if seeds:
            self._open_seeds(seeds)
            backoff, next_try, tries = 0.5, 0.0, 0
            while not self.members.live() and not self.stopping:
                now = time.monotonic()
                if now >= deadline:
                    raise UserError(
                        f"no seed answered within {self.config.connect_timeout:g}s "
                        f"({', '.join(seeds)}): check the addresses and that a seed is running "
                        "(and accepts our key), or raise --connect-timeout"
                    )
                if now >= next_try:
                    if tries:
                        log.warning("no seed answered yet; retrying in %.1fs", backoff)
                    self._hello(
                        [k for k in self.transport.neighbour_keys() if k.startswith(SEED_PREFIX)]
                    )
                    next_try, backoff, tries = now + backoff, min(backoff * 2, 5.0), tries + 1
                self._serve(min(0.1, wait_until(deadline)))
            for key in self.transport.neighbour_keys():
                if key.startswith(SEED_PREFIX):
                    self.transport.disconnect(key)
        want = self.config.wait_for_peers - 1
        next_hello = 0.0
        while len(self.members.live()) < want and time.monotonic() < deadline and not self.stopping:
            if time.monotonic() >= next_hello:
                self._hello([m.peer_id for m in self.members.pick(2)])
                next_hello = time.monotonic() + 0.3
            self._serve(0.05)
        ahead = sorted((m for m in self.members.live() if m.round > 0), key=lambda m: -m.round)
        if ahead:
            self._catch_up([m.peer_id for m in ahead])

    def _open_seeds(self, seeds: list[str]) -> None:
        for spec in seeds:
            peer_id, _, addr = spec.rpartition("@")
            if not wire.valid_addr(addr):
                raise UserError(f"bad seed '{spec}': use tcp://HOST:PORT or PEERID@tcp://HOST:PORT")
            if self.keyring is None:
                self.transport.connect(f"{SEED_PREFIX}{addr}", addr)
            elif peer_id:
                if peer_id not in self.keyring.allowed:
                    raise UserError(
                        f"seed {peer_id} has no public key in {self.config.keys}/allowed/"
                    )
                self.transport.connect(f"{SEED_PREFIX}{addr}", addr, self.keyring.allowed[peer_id])
            else:  # the seed's key is unknown: try every allowed key, the right one answers
                for pid, key in self.keyring.allowed.items():
                    if pid != self.peer_id:
                        self.transport.connect(f"{SEED_PREFIX}{addr}#{pid}", addr, key)

    def _catch_up(self, ahead: list[str]) -> None:
        """A late joiner starts from the network's model instead of from scratch.

        ``pairwise`` trusts the most advanced live peer. The robust rules pull from three and
        adopt their coordinate-wise median (and the median round), so a single poisoned peer
        claiming to be ahead cannot hand a newcomer its model; with fewer than three answers
        the newcomer keeps its own initial model.
        """
        want = 1 if self.config.mix == "pairwise" else 3
        xids = [x for x in (self._offer(pid, pull=True) for pid in ahead[:want]) if x]
        self.pulled = []
        deadline = time.monotonic() + self.config.exchange_timeout
        while set(xids) & self.pending.keys() and time.monotonic() < deadline:
            if self.stopping:
                return
            self._serve(wait_until(deadline))
        for xid in xids:
            self.pending.pop(xid, None)
        if len(self.pulled) < want:
            log.warning(
                "could not pull the current model from %d live peer(s); starting from "
                "this peer's own initial model",
                want,
            )
            return
        models = [w for _, w in self.pulled]
        if want == 1:
            adopted = OrderedDict((k, np.array(v)) for k, v in models[0].items())
        else:
            adopted = averaging.trimmed_mean(models[0], models[1:], trim_fraction=0.34)
        self.weights = adopted
        self.round = int(np.median([r for r, _ in self.pulled]))
        log.info("caught up: pulled the model of %d peer(s) at round %d", want, self.round)
