"""One round's exchanges: whom to offer to, in which waves, and what a miss costs.

``pairwise`` exchanges with one neighbour at a time; with ``group_exchange`` it offers to all
neighbours whose example count it knows at once (one wave, each offer with a ``share``) and
lands on the group's weighted average. The robust rules offer to all at once and mix once at
the end of the round. A neighbour that answers ``busy`` is replaced by a spare: peers finish
training at about the same time, so collisions are common. One that misses its deadline
becomes suspect in the member table and, after ``drop_after`` misses, is dropped and its
DEALER closed.
"""

from __future__ import annotations

import logging
import math
import time

from fedweave.config import RunConfig
from fedweave.gossip.exchange import Exchange
from fedweave.gossip.membership import DEAD, SUSPECT, Membership
from fedweave.gossip.transport import Transport

log = logging.getLogger("fedweave.gossip")


class Fanout:
    """Runs the exchanges of one round over the neighbours picked for it.

    Args:
        config: ``mix``, ``group_exchange``, ``fanout`` and ``drop_after``.
        members: the member table (spares come from it, misses go into it).
        exchange: does each wave of offers.
        transport: closes the DEALER of a dropped neighbour.
    """

    def __init__(
        self, config: RunConfig, members: Membership, exchange: Exchange, transport: Transport
    ) -> None:
        self.config = config
        self.members = members
        self.exchange = exchange
        self.transport = transport

    def run(
        self, chosen: list[str], timeout: float, retry_until: float | None = None
    ) -> tuple[list[str], list[str], float]:
        """Offer our model to ``chosen``, each wave waiting at most ``timeout`` seconds.

        Returns the neighbours contacted (``chosen`` plus the spares that replaced busy
        ones), those that missed their deadline, and the seconds spent in waves where one
        did (a dead neighbour's cost, kept out of the work that sizes the slots). Unslotted,
        at most ``fanout`` spares are tried; slotted (``retry_until``: half the slot,
        monotonic), spares are tried until then, going round the others (busy ones included:
        they are usually free a moment later) at most twice.
        """
        contacted = list(chosen)
        waves: list[tuple[list[str], int | None]]
        if self.config.gossip.mix != "pairwise":
            waves = [(contacted, None)]
        else:
            known = [pid for pid in contacted if self.exchange.knows_size_of(pid)]
            waves = [([pid], None) for pid in contacted if pid not in known]
            if self.config.gossip.group_exchange and len(known) > 1:
                waves.append((known, self.exchange.group_total(known)))
            else:
                waves += [([pid], None) for pid in known]
        failed: list[str] = []
        spares = [m.peer_id for m in self.members.pick(len(self.members.members))]
        spares = [pid for pid in spares if pid not in contacted]
        if retry_until is None or retry_until <= time.monotonic():  # unslotted, or overran
            spares, retry_until = spares[: self.config.gossip.fanout], math.inf
        else:
            spares = (spares + contacted) * 2
        lost = 0.0
        for wave, group_total in waves:  # grows while it runs: spares join as single waves
            wave_started = time.monotonic()
            outcomes = self.exchange.exchange(wave, timeout, group_total)
            if any(outcome not in ("ok", "busy", "connecting") for outcome in outcomes.values()):
                lost += time.monotonic() - wave_started
            for pid, outcome in outcomes.items():
                retry = group_total is None and spares and time.monotonic() < retry_until
                if outcome in ("busy", "connecting") and retry:
                    spare = spares.pop(0)
                    if spare not in contacted:
                        contacted.append(spare)
                    waves.append(([spare], None))
                if outcome in ("ok", "busy", "connecting"):
                    continue
                failed.append(pid)  # refused, left or missed: no exchange this round
                if outcome in ("left", "refused", "key-refused"):
                    continue
                state = self.members.missed(pid)
                if state == DEAD:
                    log.warning("dropped neighbour %s (no answer)", pid)
                    self.transport.disconnect(pid)
                elif state == SUSPECT:
                    why = "its connection closed" if outcome == "lost" else "no answer in time"
                    log.warning(
                        "neighbour %s is suspect (%s): not chosen until it answers; dropped "
                        "after %d rounds and %gs without a word",
                        pid, why, self.config.gossip.drop_after,
                        self.config.gossip.exchange_timeout,
                    )  # fmt: skip
        return contacted, failed, lost
