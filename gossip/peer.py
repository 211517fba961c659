"""The gossip peer: join → ([slot] → train → exchange → mix → record) per round → bye.

Single-threaded on purpose: one thread owns the sockets and the model, so there are no locks
and an exchange is atomic with respect to the model. While waiting for a reply the peer keeps
handling messages (holding or refusing offers, never mixing them in between), so two peers
offering to each other never deadlock. A round never waits for a global barrier: a slow or
dead neighbour costs at most ``exchange_timeout``; slotted rounds (``gossip/schedule.py``)
only wait for the clock.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

from fedweave.errors import UserError
from fedweave.gossip import averaging, wire
from fedweave.gossip.config import PeerConfig
from fedweave.gossip.history_writer import open_history
from fedweave.gossip.joining import JoiningNode
from fedweave.gossip.membership import DEAD
from fedweave.gossip.node import SEED_PREFIX
from fedweave.gossip.transport import wait_until

log = logging.getLogger("fedweave.gossip")

__all__ = ["Peer", "PeerConfig", "run_peer"]


class Peer(JoiningNode):
    """One gossip peer. ``run()`` returns the process exit code."""

    # -- lifecycle -----------------------------------------------------------------------

    def request_stop(self, signum: int = signal.SIGTERM, _frame: Any = None) -> None:
        self._stop_signal = signum

    def run(self) -> int:
        """Join, run the rounds, linger, leave; always closes sockets and the history run."""
        status, reason, completed = "completed", None, False
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
            # all rounds done counts as completed even if a signal came in meanwhile (the
            # simulation launcher ends a finished peer's linger with SIGTERM)
            completed = 0 < last <= self.round
            if not self.stopping:
                self._drain(time.monotonic() + self.config.exchange_timeout)
            if completed:
                self._linger(time.monotonic() + self.config.linger)
            if self.stopping and not completed:
                status, reason = "interrupted", f"signal {self._stop_signal}"
        except UserError as exc:
            status, reason = "failed", str(exc)
            raise
        except BaseException as exc:
            status, reason = "failed", f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._leave(status, reason)
        return 128 + self._stop_signal if self.stopping and not completed else 0

    def _linger(self, deadline: float) -> None:
        """After the last round, keep answering offers until ``deadline`` (or a signal), so
        slower peers can still mix with this peer's final model."""
        while time.monotonic() < deadline and not self.stopping:
            self._serve(min(0.2, wait_until(deadline)))  # short polls: a signal ends it soon

    def _leave(self, status: str, reason: str | None) -> None:
        """Say ``bye`` to every peer we know (not only those we have sockets to), so nobody
        waits out a deadline on us."""
        bye = wire.encode(wire.Message(wire.BYE, self.peer_id, self.addr, self.round))
        keys = {k for k in self.transport.neighbour_keys() if not k.startswith(SEED_PREFIX)}
        keys |= {m.peer_id for m in self.members.live()}
        for key in sorted(keys):
            if self._ensure_dealer(key) or self.transport.connected(key):
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

    # -- one round -----------------------------------------------------------------------

    def _round(self, r: int) -> None:
        slot_end = self._wait_for_slot(r)
        started, started_at = time.monotonic(), datetime.now(timezone.utc)
        bytes_in, bytes_out = self.transport.bytes_in, self.transport.bytes_out
        self._serve(0)
        self.learner.load(self.weights)
        train_metrics = self.learner.train(r)
        self.weights = self.learner.weights()
        trained = time.monotonic()
        self.replies = []
        chosen = [m.peer_id for m in self.members.pick(self.config.fanout)]
        failed = self._exchange(chosen, slot_end)
        if slot_end is not None:  # mix with whoever still offers, then evaluate
            self._serve_until(slot_end - 0.1 * self.config.round_interval)
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

    def _exchange(self, chosen: list[str], slot_end: float | None = None) -> list[str]:
        """Offer our model to ``chosen``; return those that missed their deadline.

        ``pairwise`` exchanges with one neighbour at a time; with ``group_exchange`` it offers
        to all neighbours whose example count it knows at once, with a ``share``
        (``group_shares``), and lands on the group's weighted average. While its offers are
        out it holds back offers from peers with a larger id (answered right after, see
        ``Node._serve_offer``) and answers ``busy`` to the others, so pairwise exchanges never
        interleave and two peers offering to each other at once complete exactly one
        exchange. Both sides of an exchange apply the same mass (delta against the sent
        snapshot), so the weighted sum is exact. The robust rules offer to all at once and
        mix once at the end of the round. ``slot_end`` (slotted rounds) bounds the retries.
        """
        timeout = self.config.exchange_timeout
        waves: list[tuple[list[str], int | None]]
        if self.config.mix != "pairwise":
            waves = [(chosen, None)]
        else:
            known = [pid for pid in chosen if pid in self.known_n]
            waves = [([pid], None) for pid in chosen if pid not in self.known_n]
            if self.config.group_exchange and len(known) > 1:
                total = self.n + sum(self.known_n[pid] for pid in known)
                waves.append((known, total))
            else:
                waves += [([pid], None) for pid in known]
        failed: list[str] = []
        # A neighbour that answers busy is replaced: peers finish training at about the same
        # time, so collisions are common. Unslotted: at most ``fanout`` replacements.
        # Slotted: until half the slot is over, going round the others (busy ones included:
        # they are usually free a moment later) at most twice.
        spares = [m.peer_id for m in self.members.pick(len(self.members.members))]
        spares = [pid for pid in spares if pid not in chosen]
        retry_until = math.inf
        half_slot = None if slot_end is None else slot_end - 0.5 * self.config.round_interval
        if half_slot is None or half_slot <= time.monotonic():  # unslotted, or overran
            spares = spares[: self.config.fanout]
        else:
            spares, retry_until = (spares + chosen) * 2, half_slot
        for wave, group_total in waves:
            xids = {pid: self._offer(pid, group_total=group_total) for pid in wave}
            self.awaiting = {x for x in xids.values() if x}
            deadline = time.monotonic() + timeout
            while self.awaiting & self.pending.keys() and not self.stopping:
                if time.monotonic() >= deadline:
                    break
                self._serve(wait_until(deadline))
            self.awaiting = set()
            self._serve_deferred()
            for pid, xid in xids.items():
                outcome = self.outcomes.pop(xid, None) if xid else "unsent"
                retry = group_total is None and spares and time.monotonic() < retry_until
                if outcome == "busy" and retry:
                    spare = spares.pop(0)
                    if spare not in chosen:
                        chosen.append(spare)
                    waves.append(([spare], None))
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
        return failed

    def _wait_for_slot(self, r: int) -> float | None:
        """With ``round_interval``, serve others until round ``r``'s slot starts (at once if
        the last round overran) and return when it ends (monotonic); else ``None``."""
        if self.slots is None:
            return None
        start, end = self.slots.slot(r, time.time())
        wait = start - time.time()
        if wait > 0:
            self._serve_until(time.monotonic() + wait)
        return time.monotonic() + (end - time.time())

    def _serve_until(self, end: float) -> None:
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
        from fedweave.history.records import RoundRecord, SiteResult
        from fedweave.learning.weights import weights_sha256

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


def run_peer(config: PeerConfig) -> int:
    """Run one peer to completion with SIGINT/SIGTERM wired to a clean shutdown."""
    peer = Peer(config)
    previous = {s: signal.signal(s, peer.request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return peer.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
