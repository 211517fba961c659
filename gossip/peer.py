"""The gossip peer: join → ([slot] → train → exchange → mix → record) per round → bye.

``Peer`` owns the parts and runs the rounds; each part has one concern and gets what it needs
passed in (no part inherits from another):

- ``Transport`` (``transport.py``): the ZeroMQ sockets.
- ``Membership`` (``membership.py``): who is out there, suspicion, drop and re-admission.
- ``Inbox`` (``inbox.py``): receiving: decode, check, count drops, hand to ``_dispatch``.
- ``Discovery`` (``discovery.py``): connections to members, ``hello``/``peers``, ``bye``.
- ``Exchange`` (``exchange.py``): offers, replies, held offers, ``busy``, and the mixing.
- ``Fanout`` (``fanout.py``): one round's waves of exchanges, spares, missed deadlines.
- ``Joining`` (``joining.py``): seeds and a late joiner's catch-up.
- ``SlotSchedule`` (``schedule.py``: agreed slots), ``Recorder`` (``peer_recorder.py``),
  ``Learner``.

Single-threaded on purpose: one thread owns the sockets and the model, so there are no locks
and an exchange is atomic with respect to the model. While waiting for a reply the peer keeps
handling messages (holding or refusing offers, never mixing them in between), so two peers
offering to each other never deadlock. A round never waits for a global barrier: a slow or
dead neighbour costs at most ``exchange_timeout``; slotted rounds only wait for their slot.
Every network wait takes an explicit timeout.
"""

from __future__ import annotations

import logging
import math
import random
import signal
import socket
import time
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any

import numpy as np

from fedweave.addresses import parse_host_port
from fedweave.config import RunConfig
from fedweave.config.commands import check_settings
from fedweave.errors import UserError
from fedweave.gossip import wire
from fedweave.gossip.console import PeerConsole
from fedweave.gossip.discovery import Discovery
from fedweave.gossip.exchange import Exchange
from fedweave.gossip.fanout import Fanout
from fedweave.gossip.inbox import Inbox
from fedweave.gossip.joining import Joining
from fedweave.gossip.keys import KeyRing, anonymous_peer_id, open_keyring
from fedweave.gossip.learner import Learner, build_learner
from fedweave.gossip.membership import Membership
from fedweave.gossip.peer_recorder import Recorder, RoundReport
from fedweave.gossip.schedule import schedule_for
from fedweave.gossip.state import PeerState
from fedweave.gossip.transport import Incoming, Transport, wait_until

log = logging.getLogger("fedweave.gossip")

__all__ = ["Peer", "run_peer", "EXIT_ALONE", "ALONE_STATUS"]

ALONE_STATUS = "completed-alone"
"""The run status of a peer that trained alone in more than ``--max-alone`` of its rounds."""
EXIT_ALONE = 3
"""Its exit code: the rounds ran, but not together (0 would tell a script all was well)."""
DUPLICATE_WINDOW_S = 15.0
"""A member heard from this recently at one address and now at another is two processes."""


def check_endpoints(listen: str, advertise: str | None) -> None:
    """Refuse, before binding, an address other hosts could not dial (PROTOCOL.md §4).

    A wildcard listen needs ``--advertise``: deriving an address from the route to a seed
    fails for the first peer (it has none) and behind NAT, so fedweave asks instead of guessing.
    """
    if advertise is not None:
        if not wire.dialable_addr(advertise):
            raise UserError(
                f"--advertise {advertise!r} is not an endpoint other hosts can dial; give "
                "tcp://HOST:PORT with this host's address or DNS name"
            )
        host, port = parse_host_port(advertise[len("tcp://") :], "--advertise")
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise UserError(
                f"--advertise {advertise}: {host} does not resolve here "
                f"({getattr(exc, 'strerror', None) or exc}); give this host's address or a DNS "
                "name the other peers can resolve"
            ) from None
        return
    if wire.valid_addr(listen) and not wire.dialable_addr(listen):
        port = listen.rsplit(":", 1)[1]
        raise UserError(
            f"--listen {listen} is a wildcard other hosts cannot dial; also pass --advertise "
            f"tcp://ADDRESS:{port} with the address the other peers reach this host at"
        )


class Peer:
    """One gossip peer. ``run()`` returns the process exit code."""

    def __init__(self, config: RunConfig) -> None:
        check_settings(config, "peer")  # the CLI did; a peer built in code gets the same checks
        self.config = config
        check_endpoints(config.peer.listen or "", config.peer.advertise)
        self.keyring: KeyRing | None = None
        if config.connection.insecure:  # with no --keys: a rule of the options (rules.py)
            log.warning(
                "plaintext gossip (--insecure): no encryption, and any host that reaches "
                "%s can claim any peer id",
                config.peer.listen,
            )
        else:
            self.keyring = open_keyring(config.peer.keys)
        max_bytes = config.gossip.max_message_mb * (1 << 20)
        self.transport = Transport(config.peer.listen, self.keyring, max_bytes)
        addr = config.peer.advertise or self.transport.address
        peer_id = self.keyring.identity.peer_id if self.keyring else anonymous_peer_id(addr)
        self.members = Membership(peer_id, addr, config.gossip.drop_after, rng=random.Random())
        if self.keyring is not None:
            self.members.allowed_ids = set(self.keyring.allowed)
        try:
            self.learner: Learner = build_learner(config, peer_id)
            weights = self.learner.weights()
            # no valid frame is larger than our largest tensor (or a header): cut the rest
            # inside libzmq, before a multipart message is buffered whole (PROTOCOL.md §6)
            self.transport.limit_frames(max((a.nbytes for a in weights.values()), default=0))
        except BaseException:
            self.transport.close()
            raise
        self.state = PeerState(
            peer_id,
            addr,
            weights,
            self.learner.num_examples,
            wire.schema_hash(weights),
            start=getattr(self.learner, "start", ""),
            schedule=schedule_for(config.gossip.round_interval),
        )
        self.recorder = Recorder(config, peer_id, self.state.start)
        self.console = PeerConsole(config.training.rounds)
        self._stop_signal = 0
        self._duplicates_told: set[tuple[str, str]] = set()
        self._last_round = 0
        """The round this run ends at (0: until stopped); it gets a checkpoint."""
        stopping = self.stopping
        self.inbox = Inbox(
            self.transport, self.state.schema, max_bytes, self._dispatch, stopping,
            self.state.start,
        )  # fmt: skip
        self.discovery = Discovery(self.state, self.members, self.transport, self.keyring)
        self.exchange = Exchange(
            config, self.state, self.members, self.transport, self.discovery, self.inbox, stopping
        )
        self.inbox.refuse = self.exchange.refuse
        self.fanout = Fanout(config, self.members, self.exchange, self.transport)
        self.joining = Joining(
            config,
            self.state,
            self.keyring,
            self.transport,
            self.members,
            self.discovery,
            self.exchange,
            self.inbox,
            stopping,
        )

    # -- lifecycle -----------------------------------------------------------------------

    def request_stop(self, signum: int = signal.SIGTERM, _frame: Any = None) -> None:
        self._stop_signal = signum

    def stopping(self) -> bool:
        """A stop signal arrived (``request_stop``): every loop ends at its next check."""
        return self._stop_signal != 0

    def run(self) -> int:
        """Join, run the rounds, linger, leave; always closes sockets and the history run.

        Returns the exit code: 0 completed, ``EXIT_ALONE`` when the peer trained alone in
        more than ``--max-alone`` of its rounds, 128 + signal when stopped before the end."""
        config = self.config
        status, reason, completed = "completed", None, False
        try:
            resumed = self.recorder.start(self.state.addr)
            if resumed is not None and resumed.weights is not None:
                self._restore(resumed.weights, resumed.round)
            log.info(
                "peer %s listening on %s (%s)",
                self.state.peer_id,
                self.state.addr,
                "CURVE" if self.keyring is not None else "plaintext: --insecure",
            )
            self.joining.join(timeout=config.connection.connect_timeout)
            if resumed is None or resumed.weights is None:  # its own model, if it has one
                self.joining.catch_up(timeout=config.gossip.exchange_timeout)
            # --rounds counts the rounds this peer trains: a late joiner that took over the
            # network's round number still trains that many; a resumed run counts from its
            # first round
            rounds = config.training.rounds
            first = resumed.first_round if resumed is not None and resumed.first_round else 0
            start = first - 1 if first else self.state.round
            last = start + rounds if rounds > 0 else 0
            self.console.rounds = last
            self._last_round = last
            while not self.stopping() and (last <= 0 or self.state.round < last):
                r, slot = self._wait_for_slot()
                if not self.stopping():
                    self._round(r, slot)
                    self._stop_if_nobody_takes_our_model()
            # all rounds done counts as completed even if a signal came in meanwhile (the
            # simulation launcher ends a finished peer's linger with SIGTERM)
            completed = 0 < last <= self.state.round
            if not self.stopping():
                self.exchange.drain(timeout=config.gossip.exchange_timeout)
            if completed:
                status, reason = self._outcome()
                table = [[m.peer_id, m.addr, m.state] for m in self.members.members.values()]
                self.recorder.done(self.state.round, table)
                self._linger(config.gossip.linger)
            if self.stopping() and not completed:
                status, reason = "interrupted", f"signal {self._stop_signal}"
        except UserError as exc:
            status, reason = "failed", str(exc)
            raise
        except BaseException as exc:
            status, reason = "failed", f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._leave(status, reason)
        if self.stopping() and not completed:
            return 128 + self._stop_signal
        return EXIT_ALONE if status == ALONE_STATUS else 0

    def _restore(self, arrays: list[Any], round_: int) -> None:
        """Take this peer's own model back from its checkpoint of ``round_`` (``--resume``)."""
        names = list(self.state.weights)
        mismatch = len(arrays) != len(names) or any(
            a.shape != w.shape or a.dtype != w.dtype
            for a, w in zip(arrays, self.state.weights.values(), strict=False)
        )
        if mismatch:
            raise UserError(
                f"the checkpoint of round {round_} holds another model than --task "
                f"{self.config.data.task} builds; resume with the task and model the run used"
            )
        self.state.weights = OrderedDict(zip(names, arrays, strict=True))
        self.state.round = round_
        log.info("took back this peer's model of round %d", round_)

    def _outcome(self) -> tuple[str, str | None]:
        """``completed``, or ``completed-alone`` with the counts when the share of rounds
        without any mix passed ``--max-alone`` (the model is then mostly this site's)."""
        seen, alone = self.console.rounds_seen, self.console.rounds_alone
        bound = self.config.gossip.max_alone
        if seen and alone / seen > bound:
            return ALONE_STATUS, (
                f"trained alone in {alone} of {seen} rounds ({alone / seen:.0%}, more than "
                f"--max-alone {bound:g})"
            )
        return "completed", None

    def _stop_if_nobody_takes_our_model(self) -> None:
        """Every live peer refused our model for its schema or its start and none ever mixed
        with us: this peer runs another task or model than the network, or started from
        another initial model, and cannot learn with it."""
        refused = self.exchange.schema_refused
        live = self.members.live()
        if self.exchange.mixes or not live or any(m.peer_id not in refused for m in live):
            return
        task = self.config.data.task
        raise UserError(
            f"every live peer ({len(live)}) refuses this peer's model: "
            f"{refused[live[0].peer_id]}; this peer runs --task {task} (schema "
            f"{self.state.schema[:16]}, initial model "
            f"{self.state.start[:16] or 'none'}): start it with the network's task, model and "
            "initial model"
        )

    def _linger(self, seconds: float) -> None:
        """After the last round: keep answering offers while a live peer still trains, at
        most ``seconds``. Every message now says ``done``; hellos to the others every
        second learn whether they are done too, so the last peers leave together instead of
        one of them training its last rounds alone."""
        self.state.done = True
        deadline = time.monotonic() + seconds
        quiet = 3 * self.config.gossip.exchange_timeout
        started = time.monotonic()
        waiting = self.members.still_training(started, quiet)
        if seconds <= 0:
            return
        if waiting:
            log.info(
                "rounds done; answering the %d peer(s) still training (at most %gs, --linger)",
                len(waiting), seconds,
            )  # fmt: skip
        next_hello = 0.0
        while not self.stopping() and time.monotonic() < deadline:
            waiting = self.members.still_training(started, quiet)
            if not waiting:
                break
            if time.monotonic() >= next_hello:
                self.discovery.hello([m.peer_id for m in waiting])
                next_hello = time.monotonic() + 1.0
            self.inbox.serve(min(0.2, wait_until(deadline)))
        else:
            if not self.stopping() and self.members.still_training(started, quiet):
                log.warning(
                    "leaving after --linger %gs while %d peer(s) still train",
                    seconds, len(self.members.still_training(started, quiet)),
                )  # fmt: skip
            return
        log.info("every peer has finished or left: leaving")

    def _refused_duplicate(self, inc: Incoming, msg: wire.Message) -> bool:
        """With CURVE, one id live at two addresses means two processes hold one key pair:
        the histories could not tell them apart and each would take the other's place.
        The first one stays; a ``hello`` or offer from the other is answered with a
        ``duplicate-id`` refusal, which stops that peer (PROTOCOL.md §4)."""
        if self.keyring is None or inc.route is None or msg.type not in (wire.HELLO, wire.OFFER):
            return False
        if msg.sender == self.state.peer_id:
            other = self.state.addr if msg.addr != self.state.addr else None
        else:
            other = self.members.duplicate(msg.sender, msg.addr, DUPLICATE_WINDOW_S)
        if other is None:
            return False
        reason = (
            f"duplicate-id: peer id {msg.sender} is live at {other} too, so two peers hold "
            "one key pair; give each site its own (`fedweave keys new`)"
        )
        if (msg.sender, msg.addr) not in self._duplicates_told and len(self._duplicates_told) < 64:
            self._duplicates_told.add((msg.sender, msg.addr))
            log.warning("refused %s at %s: %s", msg.sender, msg.addr, reason)
        if msg.type == wire.HELLO:
            self.discovery.refuse_hello(inc, reason)
        else:
            self.exchange.refuse(inc.route, msg, reason)
        return True

    def _leave(self, status: str, reason: str | None) -> None:
        self.discovery.say_bye()
        self.recorder.final(self.state.round, status, dict(self.inbox.drops), self.members.counts())
        self.transport.close(linger_ms=200)  # let the byes leave, but never wait longer
        self.recorder.checkpoint_last()
        self.recorder.finish(status, reason)
        self.console.summary(status, reason)
        if status == "interrupted" and self.recorder.run_id is not None:
            log.info("continue this run with --resume %s", self.recorder.run_id)

    def _dispatch(self, inc: Incoming, msg: wire.Message) -> None:
        """Route one checked message to the part it concerns."""
        if msg.type == wire.BYE:
            self.exchange.peer_left(msg.sender)
            self.discovery.left(msg.sender)
            return
        if self._refused_duplicate(inc, msg):
            return
        member = msg.type != wire.OFFER or self.members.is_member(msg.sender)  # before learn
        self.discovery.learn(msg)
        if self.state.schedule is not None:
            self.state.schedule.observe(msg.sender, msg.slot, time.monotonic())
        if msg.type == wire.HELLO:
            self.discovery.answer_hello(inc, msg)
        elif msg.type == wire.PEERS:
            self.discovery.take_peers(inc, msg)
        elif msg.type == wire.OFFER:
            self.exchange.on_offer(inc.route or b"", msg, member=member)
        elif msg.type == wire.REPLY:
            self.exchange.on_reply(msg)

    # -- one round -----------------------------------------------------------------------

    def _round(self, r: int, slot: tuple[float, float] | None) -> None:
        """Run round ``r``; ``slot`` is its (start, length) on the monotonic clock, or
        ``None`` for an unslotted round."""
        config = self.config
        started, started_at = time.monotonic(), datetime.now(timezone.utc)
        bytes_in, bytes_out = self.transport.bytes_in, self.transport.bytes_out
        self.inbox.serve(0)
        self.learner.load(self.state.weights)
        train_metrics = self.learner.train(r)
        self.state.weights = self.learner.weights()
        trained = time.monotonic()
        self.exchange.discard_late_replies()
        chosen = [m.peer_id for m in self.members.pick(config.gossip.fanout)]
        half_slot = None if slot is None else slot[0] + 0.5 * slot[1]
        contacted, failed, lost = self.fanout.run(chosen, config.gossip.exchange_timeout, half_slot)
        work = time.monotonic() - started - lost
        if slot is not None:  # mix with whoever still offers, evaluate just before it ends
            self.inbox.serve_for(slot[0] + 0.9 * slot[1] - time.monotonic())
        self.exchange.mix_collected()
        self.exchange.expire()
        greet, dropped = self.members.tick_suspects(config.gossip.exchange_timeout)
        for pid in dropped:
            log.warning("dropped neighbour %s after %d rounds (and %gs) without a word", pid,
                        config.gossip.drop_after, config.gossip.exchange_timeout)  # fmt: skip
            self.transport.disconnect(pid)
        self.discovery.hello(greet)
        if r % 5 == 0:
            self.discovery.probe(1)
        self.state.round = r
        self.learner.load(self.state.weights)
        evaluating = time.monotonic()
        evaluation = self.learner.evaluate() or {}
        distances = [d for d in self.exchange.take_distances() if math.isfinite(d)]
        if self.state.schedule is not None:
            self.state.schedule.measured(work + time.monotonic() - evaluating)
        report = RoundReport(
            round=r,
            started=started,
            trained=trained,
            started_at=started_at,
            contacted=contacted,
            failed=failed,
            train_metrics=train_metrics,
            evaluation=evaluation,
            bytes_in=self.transport.bytes_in - bytes_in,
            bytes_out=self.transport.bytes_out - bytes_out,
            live_members=len(self.members.live()),
            member_counts=self.members.counts(),
            drops=dict(self.inbox.drops),
            busy=self.exchange.busy_replies,
            mixes=self.exchange.mixes,
            partner_examples={
                pid: self.exchange.known_n[pid] for pid in contacted if pid in self.exchange.known_n
            },
            consensus=None if not distances else float(np.mean(distances)) / math.sqrt(2),
        )
        every = config.gossip.checkpoint_every
        checkpoint = (every > 0 and r % every == 0) or r == self._last_round
        self.recorder.round(report, self.state.weights, checkpoint=checkpoint)
        self.console.round(report)

    def _wait_for_slot(self) -> tuple[int, tuple[float, float] | None]:
        """The next round and its slot (start, length; monotonic), serving others until the
        slot starts. A lattice heard meanwhile moves the slot (``SlotSchedule.observe``);
        without slots (or before any is agreed) the next round starts at once."""
        schedule, after = self.state.schedule, self.state.round
        if schedule is None:
            return after + 1, None
        while True:
            now = time.monotonic()
            r, start, length = schedule.next_round(after, now)
            if start <= now or self.stopping():
                schedule.begin(r, start)
                return r, None if length is None else (start, length)
            self.inbox.serve(min(start - now, 0.5))  # returns early when a message came


def run_peer(config: RunConfig) -> int:
    """Run one peer to completion with SIGINT/SIGTERM wired to a clean shutdown."""
    peer = Peer(config)
    previous = {s: signal.signal(s, peer.request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return peer.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
