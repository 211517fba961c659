"""Where a peer's rounds go: the SQL history (``fedweave.history``), and for simulations a
JSON-lines results file plus per-round model dumps (for the consensus distance).

History writes sit behind ``open_history`` so the peer loop never touches the store directly.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedweave.errors import UserError
from fedweave.private_files import open_private

log = logging.getLogger("fedweave.gossip")


class HistoryWriter:
    """Round records of one peer in one run of the SQL history.

    A round that cannot be written (database down for more than 2 s, duplicate) is logged and
    skipped: the peer keeps gossiping, because a central database must not become the single
    point of failure gossip mode exists to avoid.
    """

    def __init__(self, store: Any, run_id: str, owns_run: bool) -> None:
        self.store, self.run_id, self.owns_run = store, run_id, owns_run

    def record(self, record: Any, sites: list[Any], checkpoint: Any = None) -> None:
        try:
            self.store.record_round(
                self.run_id, record, sites=sites, checkpoint=checkpoint, retry_seconds=2.0
            )
        except Exception as exc:  # a history outage must not stall or kill the gossip
            log.warning("round %s not recorded in the history: %s", record.round, exc)

    def add_checkpoint(self, actor: str, checkpoint: Any) -> None:
        """Attach a checkpoint to a round already recorded (best effort, like ``record``)."""
        try:
            self.store.add_checkpoint(self.run_id, actor, checkpoint.round, checkpoint)
        except Exception as exc:
            log.warning("checkpoint of round %s not recorded: %s", checkpoint.round, exc)

    def finish(self, status: str, reason: str | None = None) -> None:
        """Close the run, only when this peer created it (the simulation closes its own)."""
        if not self.owns_run:
            return
        try:
            self.store.finish_run(self.run_id, status, reason=reason)
        except Exception as exc:
            log.warning("run %s not closed in the history: %s", self.run_id, exc)


def open_history(
    db_url: str | None, run_id: str | None, task: str, config: dict[str, Any], seed: int
) -> HistoryWriter | None:
    """Open the store and the run (a standalone peer creates its own; a simulated one joins
    the launcher's ``run_id``); ``None`` when history is off (``db_url`` is ``None``)."""
    if db_url is None:
        return None
    store = _open_store(db_url)
    if run_id is not None:
        return HistoryWriter(store, run_id, owns_run=False)
    new_id = store.start_run(mode="gossip", task=task, config=config, seed=seed)
    return HistoryWriter(store, new_id, owns_run=True)


def _open_store(db_url: str) -> Any:
    try:
        from fedweave.history import open_store
    except ImportError as exc:  # pragma: no cover - the store ships with fedweave
        raise UserError(f"the history store cannot be loaded ({exc}); run without --db") from exc
    return open_store(db_url)


@dataclass
class ResumePoint:
    """Where a peer resuming its own run starts.

    Attributes:
        weights: its model from its last checkpoint (``None``: it has none; it then takes
            the network's model, as a late joiner does).
        round: the round of that checkpoint (0 without one).
        first_round: the first round it trained in this run (rounds count from there).
    """

    weights: list[np.ndarray] | None
    round: int
    first_round: int


def resume_history(
    db_url: str | None, ref: str, task: str, peer_id: str
) -> tuple[HistoryWriter, ResumePoint]:
    """Reopen this peer's run ``ref`` (an id, a prefix or ``latest``) to continue it from its
    last checkpoint: ``UserError`` naming why when it cannot be (another mode, task or peer,
    still running, already complete, a damaged checkpoint). Rounds recorded after that
    checkpoint are discarded: they are run again."""
    if db_url is None:
        raise UserError("--resume needs the history the run was recorded in: drop --db none")
    store = _open_store(db_url)
    info = store.get_run(ref)
    run = f"run {info.run_id}"
    command = (info.config or {}).get("command")
    if info.mode != "gossip" or command != "peer":
        what = f"`fedweave {command}`" if command else f"a {info.mode} command"
        raise UserError(f"{run} was recorded by {what}; --resume continues a `fedweave peer` run")
    if info.task != task:
        raise UserError(f"{run} trains --task {info.task}, not {task}: resume it with that task")
    if info.status == "running":
        raise UserError(
            f"{run} is still running (pid {info.pid} on {info.hostname}); stop that peer first"
        )
    if info.status in ("completed", "completed-alone"):
        raise UserError(f"{run} already {info.status} {info.rounds_completed} rounds; nothing to "
                        "resume (start the peer without --resume for a new run)")  # fmt: skip
    first = store.first_round(info.run_id, peer_id)
    if first is None:
        raise UserError(
            f"{run} has no rounds of this peer ({peer_id}): it is another peer's run (pass the "
            "--keys it ran with), or it never trained; start without --resume"
        )
    checkpoint = store.latest_checkpoint(info.run_id, actor=peer_id)
    weights = None
    if checkpoint is not None:
        from fedweave.learning.weights import load_weights_npz

        try:
            weights = load_weights_npz(checkpoint.path, checkpoint.sha256)
        except (OSError, ValueError) as exc:
            raise UserError(
                f"cannot resume {run}: checkpoint {checkpoint.path} unusable ({exc})"
            ) from None
    at = checkpoint.round if checkpoint is not None else 0
    dropped = store.discard_rounds_after(info.run_id, peer_id, at)
    store.mark_running(info.run_id)
    if checkpoint is not None:
        log.info(
            "resuming run %s from this peer's checkpoint of round %d (%d later round(s) "
            "will be run again)",
            info.run_id, at, dropped,
        )  # fmt: skip
    else:
        log.warning(
            "run %s has no checkpoint of this peer: resuming it from the network's model",
            info.run_id,
        )
        first = 0
    return HistoryWriter(store, info.run_id, owns_run=True), ResumePoint(weights, at, first)


class ResultsLog:
    """JSON lines a simulation launcher tails: ``ready``, ``round`` (each), ``done``, ``final``.

    Each line is written and flushed whole, so a reader never sees half a record even if the
    peer is killed mid-run.
    """

    def __init__(self, path: Path | None, dump_dir: Path | None) -> None:
        self.path, self.dump_dir = path, dump_dir
        self._handle = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open_private(path, "a", encoding="utf-8")
        if dump_dir is not None:
            dump_dir.mkdir(parents=True, exist_ok=True)

    def event(self, kind: str, **fields: Any) -> None:
        if self._handle is None:
            return
        fields = {"event": kind, "t": time.time(), **fields}
        self._handle.write(json.dumps(fields, default=float) + "\n")
        self._handle.flush()

    def dump(self, round_: int, vector: np.ndarray) -> None:
        """Save the flattened model of this round (float32) for the consensus distance."""
        if self.dump_dir is None:
            return
        tmp = self.dump_dir / f"round-{round_}.tmp.npy"
        np.save(tmp, vector.astype(np.float32 if vector.size > 1000 else np.float64))
        tmp.replace(self.dump_dir / f"round-{round_}.npy")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
