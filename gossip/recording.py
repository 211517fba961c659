"""What a peer leaves behind: the ``ready`` / ``round`` / ``done`` / ``final`` events and
model dumps a simulation reads (``ResultsLog``), and one row per round in the SQL history run
(``HistoryWriter``). Only the peer's own thread calls it, between network waits."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np

from fedweave.config import RunConfig
from fedweave.config.resume import stored_run_config
from fedweave.gossip import averaging
from fedweave.gossip.history_writer import HistoryWriter, ResultsLog, open_history


@dataclass
class RoundReport:
    """What happened in one round, as the peer saw it.

    Attributes:
        round: the round number.
        started / trained: ``time.monotonic()`` at its start and after local training.
        started_at: wall-clock start.
        contacted / failed: neighbours offered to, and those that missed their deadline.
        train_metrics / evaluation: local training metrics, and loss/accuracy after mixing.
        bytes_in / bytes_out: traffic during the round.
        live_members / member_counts: live members at its end, and the table by state.
        drops / busy / mixes: the peer's running counts of dropped messages (by reason),
            ``busy`` answers to its offers and mixes.
    """

    round: int
    started: float
    trained: float
    started_at: datetime
    contacted: list[str]
    failed: list[str]
    train_metrics: dict[str, float]
    evaluation: dict[str, float]
    bytes_in: int
    bytes_out: int
    live_members: int
    member_counts: dict[str, int]
    drops: dict[str, int]
    busy: int
    mixes: int


class Recorder:
    """The results log (opened now) and the history run (opened by ``start``) of one peer."""

    def __init__(self, config: RunConfig, peer_id: str) -> None:
        self.config = config
        self.peer_id = peer_id
        self.results = ResultsLog(config.peer.results, config.peer.dump_models)
        self.history: HistoryWriter | None = None

    def start(self, addr: str) -> None:
        """Open the history run (``--db``) and announce the peer as ``ready``."""
        config = self.config
        db = config.history.db
        self.history = open_history(
            None if db.lower() == "none" else db,
            config.peer.run_id,
            config.data.task,
            stored_run_config(config, "peer"),
            config.training.seed,
        )
        self.results.event("ready", peer=self.peer_id, addr=addr)

    def round(self, report: RoundReport, weights: OrderedDict[str, np.ndarray]) -> None:
        """Dump the round's model, write its ``round`` event and its history row."""
        seconds = time.monotonic() - report.started
        contacted, failed = report.contacted, report.failed
        self.results.dump(report.round, averaging.flatten(weights))
        self.results.event(
            "round",
            round=report.round,
            peer=self.peer_id,
            accuracy=report.evaluation.get("accuracy"),
            loss=report.evaluation.get("loss"),
            seconds=seconds,
            train_seconds=report.trained - report.started,
            neighbours=len(contacted),
            replied=len(contacted) - len(failed),
            failed=len(failed),
            failed_peers=failed,
            members=report.live_members,
            drops=sum(report.drops.values()),
            busy=report.busy,
            mixes=report.mixes,
        )
        if self.history is None:
            return
        from fedweave.history.records import RoundRecord, SiteResult
        from fedweave.learning.weights import weights_sha256

        record = RoundRecord(
            round=report.round,
            actor=self.peer_id,
            started_at=report.started_at,
            ended_at=datetime.now(timezone.utc),
            sampled=len(contacted),
            replied=len(contacted) - len(failed),
            failed=len(failed),
            train_metrics=report.train_metrics,
            eval_loss=report.evaluation.get("loss"),
            eval_accuracy=report.evaluation.get("accuracy"),
            model_sha256=weights_sha256(list(weights.values())),
            bytes_in=report.bytes_in,
            bytes_out=report.bytes_out,
            extra={
                "mix": self.config.gossip.mix,
                "members": report.member_counts,
                "drops": report.drops,
                "seconds": seconds,
            },
        )
        sites = [
            SiteResult(
                site_id=pid,
                status="failed" if pid in failed else "ok",
                reason="missed its deadline" if pid in failed else None,
            )
            for pid in contacted
        ]
        self.history.record(record, sites)

    def done(self, round_: int, members: list[list[str]]) -> None:
        """Write the ``done`` event: the rounds are over (the peer may still linger);
        ``members`` is its member table, ``[peer_id, addr, state]`` each."""
        self.results.event("done", round=round_, members=members)

    def final(
        self, round_: int, status: str, drops: dict[str, int], members: dict[str, int]
    ) -> None:
        """Write the ``final`` event and close the results log."""
        self.results.event("final", round=round_, status=status, drops=drops, members=members)
        self.results.close()

    def finish(self, status: str, reason: str | None) -> None:
        """Close the history run with ``status`` (when this peer opened it)."""
        if self.history is not None:
            self.history.finish(status, reason)
