"""A peer's ``Recorder``: after each round it writes what the peer leaves behind through the
two writers of ``peer_outputs.py``: the ``ready`` / ``round`` / ``done`` / ``final`` events
and model dumps a simulation reads (``ResultsLog``), and one row per round in the SQL history
run (``HistoryWriter``). Only the peer's own thread calls it, between network waits."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from fedweave.config import RunConfig
from fedweave.config.resume import stored_run_config
from fedweave.gossip import averaging
from fedweave.gossip.peer_outputs import (
    HistoryWriter,
    ResultsLog,
    ResumePoint,
    open_history,
    resume_history,
)
from fedweave.learning.adapters import run_adapter

log = logging.getLogger("fedweave.gossip")


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
        partner_examples / consensus: see below.
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
    partner_examples: dict[str, int] = field(default_factory=dict)
    """Example counts the neighbours stated with their models (as counted: capped)."""
    consensus: float | None = None
    """Consensus estimate: the mean L2 distance between this peer's model and the models it
    mixed with this round, over sqrt(2) (for models spread alike around their mean, the mean
    distance to the mean); ``None`` when it mixed with nobody."""


class Recorder:
    """The results log (opened now) and the history run (opened by ``start``) of one peer,
    with its model checkpoints (``--checkpoint-dir``/RUN/PEER/round-NNNNN.npz, the history's
    checkpoint format: ``fedweave history export`` copies the last one, and a ``--resume``
    starts from it)."""

    def __init__(self, config: RunConfig, peer_id: str, start: str = "") -> None:
        self.config = config
        self.peer_id = peer_id
        self.initial_sha256 = start
        """The sha256 of the peer's ``--initial-model`` (``""``: none), pinned with the run."""
        self.results = ResultsLog(config.peer.results, config.peer.dump_models)
        self.history: HistoryWriter | None = None
        self._last: tuple[int, OrderedDict[str, np.ndarray], bool] | None = None
        """The last recorded round, its model and whether it has a checkpoint."""

    def start(self, addr: str) -> ResumePoint | None:
        """Open the history run (``--db``; with ``--resume``, this peer's earlier run) and
        announce the peer as ``ready``. Returns where a resumed run starts."""
        config = self.config
        db = config.history.db
        url = None if db.lower() == "none" else db
        point = None
        if config.history.resume:
            self.history, point = resume_history(
                url, config.history.resume, config.data.task, self.peer_id
            )
        else:
            stored = stored_run_config(config, "peer")
            if self.initial_sha256:
                path = str(Path(config.training.initial_model).resolve())
                stored["initial_model"] = {"path": path, "sha256": self.initial_sha256}
            adapter = run_adapter(config)  # a LoRA run's checkpoints are its adapter's tensors
            if adapter is not None:
                stored["adapter"] = adapter
            self.history = open_history(
                url, config.peer.run_id, config.data.task, stored, config.training.seed
            )
        self.results.event("ready", peer=self.peer_id, addr=addr)
        return point

    @property
    def run_id(self) -> str | None:
        return self.history.run_id if self.history is not None else None

    def _checkpoint(self, round_: int, weights: OrderedDict[str, np.ndarray]) -> Any:
        """Write the model of ``round_`` (atomically) and return its ``CheckpointRef``."""
        from fedweave.history.records import CheckpointRef
        from fedweave.learning.weights import save_weights_npz

        assert self.history is not None
        path = (
            self.config.history.checkpoint_dir
            / self.history.run_id
            / self.peer_id
            / f"round-{round_:05d}.npz"
        )
        digest, size = save_weights_npz(path, list(weights.values()))
        return CheckpointRef(round_, str(path.resolve()), digest, size)

    def checkpoint_last(self) -> None:
        """Leaving: the last recorded round gets its checkpoint if it had none (the model
        out, and where a ``--resume`` starts)."""
        if self.history is None or self._last is None or self._last[2]:
            return
        round_, weights, _ = self._last
        try:
            self.history.add_checkpoint(self.peer_id, self._checkpoint(round_, weights))
        except OSError as exc:
            log.warning("checkpoint of round %d not written: %s", round_, exc)

    def round(
        self,
        report: RoundReport,
        weights: OrderedDict[str, np.ndarray],
        checkpoint: bool = False,
    ) -> None:
        """Dump the round's model, write its ``round`` event and its history row (with a
        checkpoint file when ``checkpoint``)."""
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
            consensus_estimate=report.consensus,
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
                "mixes": report.mixes,
                "consensus_estimate": report.consensus,
            },
        )
        sites = [
            SiteResult(
                site_id=pid,
                status="failed" if pid in failed else "ok",
                num_examples=report.partner_examples.get(pid, 0),
                reason="missed its deadline" if pid in failed else None,
            )
            for pid in contacted
        ]
        ref = None
        if checkpoint:
            try:
                ref = self._checkpoint(report.round, weights)
            except OSError as exc:  # a full disk must not stop the gossip; said, not hidden
                log.warning("checkpoint of round %d not written: %s", report.round, exc)
        self.history.record(record, sites, ref)
        self._last = (report.round, weights, ref is not None)

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
