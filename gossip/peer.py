"""The gossip peer: join → (train → exchange → mix → record) per round → bye.

Single-threaded on purpose: one thread owns the sockets and the model, so there are no locks
and an exchange is atomic with respect to the model. While waiting for replies the peer keeps
serving others' offers, so two peers offering to each other never deadlock. A round never
waits for a global barrier: a slow or dead neighbour costs at most ``exchange_timeout``.
"""

from __future__ import annotations

import logging
import random
import signal
import time
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from fedweave.errors import UserError
from gossip import averaging, wire
from gossip.keys import KeyRing, anonymous_peer_id, load_keyring
from gossip.learner import Learner, build_learner
from gossip.membership import DEAD, Membership
from gossip.recording import HistoryWriter, ResultsLog, open_history
from gossip.transport import Incoming, Transport, wait_until

log = logging.getLogger("fedweave.gossip")
SEED_PREFIX = "seed:"


@dataclass
class PeerConfig:
    """Everything ``fedweave peer`` takes. Defaults in brackets.

    Attributes:
        listen: endpoint to bind, ``tcp://HOST:PORT``.
        seeds: endpoints of peers to join through, ``tcp://A:P`` or ``PEERID@tcp://A:P`` [].
        task / data / test: task name, local data file, optional held-out file to evaluate on.
        rounds: rounds to run; 0 runs until SIGTERM [50].
        db / run_id: history URL (``None``: no history) and an existing run to write into.
        keys: CURVE key directory (``None``: plaintext) [None].
        fanout: neighbours contacted per round [2].
        mix: ``pairwise`` | ``clipped`` | ``trimmed`` [pairwise].
        clip_tau: ClippedGossip radius; ``None`` adapts it (median of recent norms).
        trim_fraction: share trimmed at each end by ``trimmed`` [0.2].
        exchange_timeout: seconds to wait for neighbours' replies each round [5].
        connect_timeout: seconds to keep trying the seeds before giving up [30].
        drop_after: consecutive misses before a neighbour is dropped [3].
        max_message_mb: largest accepted message [1024].
        wait_for_peers: before round 1, wait (≤ connect_timeout) until this many peers,
            self included, are known; simulations use it so nobody races ahead alone [0].
        results / dump_models: JSON-lines results and per-round model dumps (simulations).
        vector / vector_examples: gossip a fixed ``.npy`` vector instead of a task (tests).
    """

    listen: str
    seeds: list[str] = field(default_factory=list)
    task: str = "digits"
    data: Path | None = None
    test: Path | None = None
    rounds: int = 50
    db: str | None = None
    run_id: str | None = None
    keys: Path | None = None
    fanout: int = 2
    mix: str = "pairwise"
    clip_tau: float | None = None
    trim_fraction: float = 0.2
    epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    device: str | None = None
    seed: int = 0
    exchange_timeout: float = 5.0
    connect_timeout: float = 30.0
    drop_after: int = 3
    max_message_mb: int = 1024
    wait_for_peers: int = 0
    round_interval: float = 0.0
    results: Path | None = None
    dump_models: Path | None = None
    vector: Path | None = None
    vector_examples: int = 1


@dataclass
class _Pending:
    peer_id: str
    snapshot: OrderedDict[str, np.ndarray]
    expires: float
    round: int
    pull: bool = False


class Peer:
    """One gossip peer. ``run()`` returns the process exit code."""

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
        self.learner: Learner = build_learner(config, ident)
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
        self.outcomes: dict[int, str] = {}
        self.busy_replies = 0
        self.mixes = 0
        self._round_started = 0.0
        self.drops: Counter[str] = Counter()
        self._last_logged: dict[str, float] = {}
        self._stop_signal = 0
        self.history: HistoryWriter | None = None
        self.results = ResultsLog(config.results, config.dump_models)

    # -- lifecycle -----------------------------------------------------------------------

    def request_stop(self, signum: int = signal.SIGTERM, _frame: Any = None) -> None:
        self._stop_signal = signum

    @property
    def stopping(self) -> bool:
        return self._stop_signal != 0

    def run(self) -> int:
        """Join, run the rounds, leave; always closes sockets and the history run."""
        status, reason = "completed", None
        try:
            self.history = open_history(
                self.config.db,
                self.config.run_id,
                self.config.task,
                {k: str(v) for k, v in asdict(self.config).items()},
                self.config.seed,
            )
            self.results.event("ready", peer=self.peer_id, addr=self.addr)
            log.info("peer %s listening on %s", self.peer_id, self.addr)
            self._join()
            last = self.config.rounds
            while not self.stopping and (last <= 0 or self.round < last):
                self._round(self.round + 1)
            if not self.stopping:
                self._drain(time.monotonic() + self.config.exchange_timeout)
            if self.stopping:
                status, reason = "interrupted", f"signal {self._stop_signal}"
        except UserError as exc:
            status, reason = "failed", str(exc)
            raise
        except BaseException as exc:
            status, reason = "failed", f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._leave(status, reason)
        return 128 + self._stop_signal if self.stopping else 0

    def _leave(self, status: str, reason: str | None) -> None:
        bye = wire.encode(wire.Message(wire.BYE, self.peer_id, self.addr, self.round))
        for key in self.transport.neighbour_keys():
            if not key.startswith(SEED_PREFIX):
                self.transport.send(key, list(bye))
        self.results.event(
            "final",
            round=self.round,
            status=status,
            drops=dict(self.drops),
            members=self.members.counts(),
        )
        self.results.close()
        self.transport.close(linger_ms=200)  # let the byes leave, but never wait longer
        if self.history is not None:
            self.history.finish(status, reason)

    # -- joining -------------------------------------------------------------------------

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
        best, best_round = self.members.max_round()
        if best is not None and best_round > 0:
            self._catch_up(best, best_round)

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

    def _catch_up(self, peer_id: str, its_round: int) -> None:
        """A late joiner starts from a live peer's model instead of from scratch."""
        xid = self._offer(peer_id, pull=True)
        deadline = time.monotonic() + self.config.exchange_timeout
        while xid in self.pending and time.monotonic() < deadline and not self.stopping:
            self._serve(wait_until(deadline))
        if xid in self.pending:
            self.pending.pop(xid)
            log.warning("could not pull the current model from %s; starting from scratch", peer_id)

    # -- one round -----------------------------------------------------------------------

    def _round(self, r: int) -> None:
        started, started_at = time.monotonic(), datetime.now(timezone.utc)
        self._round_started = started
        bytes_in, bytes_out = self.transport.bytes_in, self.transport.bytes_out
        self._serve(0)
        self.learner.load(self.weights)
        train_metrics = self.learner.train(r)
        self.weights = self.learner.weights()
        trained = time.monotonic()
        self.replies = []
        chosen = [m.peer_id for m in self.members.pick(self.config.fanout)]
        failed = self._exchange(chosen)
        self._mix_robust()
        self._expire_pending()
        if r % 5 == 0:
            self._hello([m.peer_id for m in self.members.probe_candidates(1)])
        self.round = r
        self.learner.load(self.weights)
        evaluation = self.learner.evaluate() or {}
        self._record(
            r,
            started,
            trained,
            started_at,
            chosen,
            failed,
            train_metrics,
            evaluation,
            self.transport.bytes_in - bytes_in,
            self.transport.bytes_out - bytes_out,
        )

    def _exchange(self, chosen: list[str]) -> list[str]:
        """Offer our model to ``chosen``; return those that missed their deadline.

        ``pairwise`` exchanges one neighbour at a time. Meanwhile it serves offers from peers
        with a smaller id and answers ``busy`` to the others: two peers offering to each other
        at once then complete exactly one exchange (not zero, not two), and a peer mixes in
        at most a few offers while its own is in flight. Whatever interleaves, both sides
        apply the same mass (delta against the sent snapshot), so the weighted sum is exact.
        The robust rules offer to all at once and mix once at the end of the round.
        """
        timeout = self.config.exchange_timeout
        if self.config.mix == "pairwise":
            waves = [[pid] for pid in chosen]
        else:
            waves = [chosen]
        failed: list[str] = []
        for wave in waves:
            xids = {pid: self._offer(pid) for pid in wave}
            self.awaiting = {x for x in xids.values() if x}
            deadline = time.monotonic() + timeout
            while self.awaiting & self.pending.keys() and not self.stopping:
                if time.monotonic() >= deadline:
                    break
                self._serve(wait_until(deadline))
            self.awaiting = set()
            for pid, xid in xids.items():
                outcome = self.outcomes.pop(xid, None) if xid else "unsent"
                if outcome in ("ok", "busy"):
                    continue
                failed.append(pid)
                if outcome != "left" and self.members.missed(pid) == DEAD:
                    log.warning(
                        "dropped neighbour %s after %d missed deadlines",
                        pid,
                        self.config.drop_after,
                    )
                    self.transport.disconnect(pid)
        if self.config.round_interval > 0:
            self._pace()
        return failed

    def _pace(self) -> None:
        """Serve others until the round has lasted ``round_interval`` seconds."""
        end = self._round_started + self.config.round_interval
        while time.monotonic() < end and not self.stopping:
            self._serve(wait_until(end))

    def _record(
        self,
        r: int,
        started: float,
        trained: float,
        started_at: datetime,
        chosen: list[str],
        failed: list[str],
        train_metrics: dict[str, float],
        evaluation: dict[str, float],
        bytes_in: int,
        bytes_out: int,
    ) -> None:
        seconds = time.monotonic() - started
        flat = averaging.flatten(self.weights)
        self.results.dump(r, flat)
        self.results.event(
            "round",
            round=r,
            peer=self.peer_id,
            accuracy=evaluation.get("accuracy"),
            loss=evaluation.get("loss"),
            seconds=seconds,
            train_seconds=trained - started,
            neighbours=len(chosen),
            replied=len(chosen) - len(failed),
            failed=len(failed),
            members=len(self.members.live()),
            drops=sum(self.drops.values()),
            busy=self.busy_replies,
            mixes=self.mixes,
        )
        if self.history is None:
            return
        from client.weights import weights_sha256
        from fedweave.history.records import RoundRecord, SiteResult

        record = RoundRecord(
            round=r,
            actor=self.peer_id,
            started_at=started_at,
            ended_at=datetime.now(timezone.utc),
            sampled=len(chosen),
            replied=len(chosen) - len(failed),
            failed=len(failed),
            train_metrics=train_metrics,
            eval_loss=evaluation.get("loss"),
            eval_accuracy=evaluation.get("accuracy"),
            model_sha256=weights_sha256(list(self.weights.values())),
            bytes_in=bytes_in,
            bytes_out=bytes_out,
            extra={
                "mix": self.config.mix,
                "members": self.members.counts(),
                "drops": dict(self.drops),
                "seconds": seconds,
            },
        )
        sites = [
            SiteResult(
                site_id=pid,
                status="failed" if pid in failed else "ok",
                reason="missed its deadline" if pid in failed else None,
            )
            for pid in chosen
        ]
        self.history.record(record, sites)

    def _drain(self, deadline: float) -> None:
        """After the last round, apply replies still in flight (keeps the average exact)."""
        while self.pending and time.monotonic() < deadline and not self.stopping:
            self._serve(wait_until(deadline))

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

    def _offer(self, peer_id: str, pull: bool = False) -> int:
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
        )
        if not self.transport.send(peer_id, wire.encode(msg)):
            return 0
        expires = time.monotonic() + 3 * self.config.exchange_timeout
        self.pending[xid] = _Pending(peer_id, snapshot, expires, self.round, pull)
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
        if (
            self.config.mix == "pairwise"
            and self.awaiting
            and not msg.pull
            and msg.sender > self.peer_id
        ):
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
                mine, mine, msg.tensors, self.n, msg.num_examples
            )
        else:
            self.buffered[msg.sender] = (msg.tensors, msg.num_examples)

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
            self.weights = OrderedDict((k, np.array(v)) for k, v in msg.tensors.items())
            self.round = max(self.round, msg.round)
            log.info("caught up: pulled the model of %s at round %d", msg.sender, msg.round)
        elif self.config.mix == "pairwise":
            self.mixes += 1
            self.weights = averaging.pairwise_update(
                self.weights, pending.snapshot, msg.tensors, self.n, msg.num_examples
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
        self.weights = averaging.clipped_update(self.weights, list(models.values()), self.n, tau)


def run_peer(config: PeerConfig) -> int:
    """Run one peer to completion with SIGINT/SIGTERM wired to a clean shutdown."""
    peer = Peer(config)
    previous = {s: signal.signal(s, peer.request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return peer.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
