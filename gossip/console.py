"""What a peer's operator reads: one line per round (every few rounds when rounds are faster
than two a second), a warning the moment the peer trains alone, and a summary at the end.

A peer that mixes with nobody still "completes" its rounds; its model is then its own data's
alone. The results log and the history have every number, but the operator watches the
console, so being alone is said when it starts (and every ``REMIND_EVERY`` rounds while it
lasts), when it ends, and in the summary.
"""

from __future__ import annotations

import logging
import math
import time

from fedweave.gossip.peer_recorder import RoundReport

log = logging.getLogger("fedweave.gossip")

REMIND_EVERY = 10
"""Rounds alone between two reminders."""
LINE_EVERY_S = 0.5
"""At most about two round lines a second when rounds are faster (see ``_worth_a_line``)."""
LINE_EVERY_ROUNDS = 5
"""Every this many rounds a line is printed however fast the rounds go."""


class PeerConsole:
    """Turns each round's report into the operator's lines.

    Args:
        rounds: the run's last round (0: until stopped), for ``round r/N``.
    """

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self._mixes = 0
        self.rounds_seen = 0
        self.rounds_alone = 0
        self._alone_since: int | None = None
        self._printed_at = -math.inf

    def _worth_a_line(self, report: RoundReport, mixed: int) -> bool:
        """Every round, unless rounds come faster than ``LINE_EVERY_S``: then the first,
        the last, every ``LINE_EVERY_ROUNDS``-th, and any round with a missed partner or
        without a mix (the results log and the history keep every round)."""
        now = time.monotonic()
        if (
            now - self._printed_at >= LINE_EVERY_S
            or report.round % LINE_EVERY_ROUNDS == 0
            or self.rounds_seen == 1
            or report.round == self.rounds
            or report.failed
            or mixed == 0
        ):
            self._printed_at = now
            return True
        return False

    def round(self, report: RoundReport) -> None:
        mixed = report.mixes - self._mixes
        self._mixes = report.mixes
        self.rounds_seen += 1
        accuracy = report.evaluation.get("accuracy")
        loss = report.evaluation.get("loss")
        metrics = "".join(
            f"{name} {value:.4f}; "
            for name, value in (("accuracy", accuracy), ("loss", loss))
            if value is not None
        )
        of = f"/{self.rounds}" if self.rounds > 0 else ""
        consensus = "" if report.consensus is None else f"; consensus ~{report.consensus:.3g}"
        if self._worth_a_line(report, mixed):
            log.info(
                "round %d%s: %smixed %d time(s); %d of %d neighbour(s) answered; %d member(s) "
                "live%s",
                report.round, of, metrics, mixed, len(report.contacted) - len(report.failed),
                len(report.contacted), report.live_members, consensus,
            )  # fmt: skip
        if mixed > 0:
            if self._alone_since is not None:
                log.info(
                    "mixing again after %d round(s) alone (rounds %d-%d)",
                    report.round - self._alone_since, self._alone_since, report.round - 1,
                )  # fmt: skip
                self._alone_since = None
            return
        self.rounds_alone += 1
        if self._alone_since is None:
            self._alone_since = report.round
        alone_for = report.round - self._alone_since
        if alone_for % REMIND_EVERY == 0:
            log.warning(
                "training alone since round %d: no neighbour mixed with this peer (%d member(s) "
                "live); its model learns from this site's data only until one does",
                self._alone_since, report.live_members,
            )  # fmt: skip

    def summary(self, status: str, reason: str | None = None) -> None:
        """The last line: how many rounds mixed, how many alone, and (``completed-alone``)
        that the run did not learn together."""
        mixed = self.rounds_seen - self.rounds_alone
        if not self.rounds_seen and status == "failed":
            return  # the error line says it all
        if self.rounds_seen and mixed == 0:
            log.warning(
                "%s: %d round(s), never mixed with another peer: this model is this site's "
                "alone (start the others, check --seeds and the allowed keys)",
                status, self.rounds_seen,
            )  # fmt: skip
            return
        if status == "completed-alone":
            log.warning(
                "%s: %d round(s), mixed with neighbours in %d, alone in %d: %s; this model "
                "learned mostly from this site's data",
                status, self.rounds_seen, mixed, self.rounds_alone, reason,
            )  # fmt: skip
            return
        log.info(
            "%s: %d round(s), mixed with neighbours in %d, alone in %d",
            status, self.rounds_seen, mixed, self.rounds_alone,
        )  # fmt: skip
