"""A peer's console: a line per round, a warning when it starts training alone, a reminder
while it lasts, a line when it mixes again, and a summary that says a solo run was one."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from fedweave.gossip.console import REMIND_EVERY, PeerConsole
from fedweave.gossip.peer_recorder import RoundReport


def _report(round_: int, mixes: int, live: int = 2) -> RoundReport:
    return RoundReport(
        round=round_, started=0.0, trained=0.0, started_at=datetime.now(timezone.utc),
        contacted=["a", "b"], failed=["b"], train_metrics={},
        evaluation={"accuracy": 0.5, "loss": 1.0}, bytes_in=0, bytes_out=0,
        live_members=live, member_counts={}, drops={}, busy=0, mixes=mixes,
    )  # fmt: skip


def test_rounds_alone_are_said_when_they_start_while_they_last_and_when_they_end(caplog):
    console = PeerConsole(rounds=40)
    mixes = [1, 3] + [3] * (REMIND_EVERY + 2) + [4]  # mixes, then alone, then mixes again
    with caplog.at_level(logging.INFO, logger="fedweave.gossip"):
        for r, total in enumerate(mixes, start=1):
            console.round(_report(r, total))
        console.summary("completed")
    lines = [rec.getMessage() for rec in caplog.records]
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert lines[0] == (
        "round 1/40: accuracy 0.5000; loss 1.0000; mixed 1 time(s); 1 of 2 neighbour(s) "
        "answered; 2 member(s) live"
    )
    assert len(warnings) == 2  # when it starts (round 3) and REMIND_EVERY rounds later
    assert all(w.startswith("training alone since round 3") for w in warnings)
    assert f"mixing again after {REMIND_EVERY + 2} round(s) alone (rounds 3-14)" in lines
    assert lines[-1] == (
        f"completed: {len(mixes)} round(s), mixed with neighbours in 3, alone in {REMIND_EVERY + 2}"
    )


def test_a_peer_that_never_mixed_says_so_at_the_end(caplog):
    console = PeerConsole(rounds=0)
    with caplog.at_level(logging.INFO, logger="fedweave.gossip"):
        for r in range(1, 4):
            console.round(_report(r, 0, live=0))
        console.summary("completed")
    assert caplog.records[0].getMessage().startswith("round 1: accuracy")  # no /N: until stopped
    last = caplog.records[-1]
    assert last.levelno == logging.WARNING
    assert last.getMessage().startswith("completed: 3 round(s), never mixed with another peer")


def test_fast_rounds_get_a_line_every_few_rounds_and_every_notable_one(caplog):
    from fedweave.gossip.console import LINE_EVERY_ROUNDS

    console = PeerConsole(rounds=23)
    with caplog.at_level(logging.INFO, logger="fedweave.gossip"):
        for r in range(1, 24):  # instant rounds, each mixing once; round 13 misses a partner
            report = _report(r, r)
            report.failed = ["b"] if r == 13 else []
            console.round(report)
    printed = [int(m.split()[1].split("/")[0]) for m in caplog.messages if m.startswith("round ")]
    every = list(range(LINE_EVERY_ROUNDS, 24, LINE_EVERY_ROUNDS))
    assert printed == sorted({1, 13, 23, *every})  # first, missed partner, last, every 5th
