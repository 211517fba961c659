"""Record each federated round in the SQL history, with its checkpoint, in one transaction."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from fedweave.errors import UserError
from fedweave.history.records import COORDINATOR_ACTOR, CheckpointRef, RoundInFlight, RoundRecord
from fedweave.history.round_summary import RoundSummary
from fedweave.history.store_errors import HistoryError
from fedweave.learning.weights import load_weights_npz, save_weights_npz, weights_sha256

log = logging.getLogger(__name__)


def checkpoint_path(checkpoint_dir: Path, run_id: str, round_number: int) -> Path:
    """Where the global model after ``round_number`` of ``run_id`` is kept."""
    return checkpoint_dir / run_id / f"round-{round_number:05d}.npz"


def resume_point(store, run_id: str) -> tuple[list | None, int]:
    """(global weights, rounds done) to continue ``run_id`` from; (None, 0) before round 1.

    The checkpoint is checked against the sha256 recorded with its round, so a damaged file
    stops the resume instead of silently restarting from it.
    """
    checkpoint = store.latest_checkpoint(run_id)
    if checkpoint is None:
        return None, 0
    try:
        weights = load_weights_npz(checkpoint.path, checkpoint.sha256)
    except (OSError, ValueError) as exc:
        raise UserError(
            f"cannot resume run {run_id}: checkpoint {checkpoint.path} unusable ({exc})"
        ) from exc
    return weights, checkpoint.round


def evaluation_extra(summary: RoundSummary) -> dict[str, Any]:
    """The round's evaluations as kept in ``Round.extra["evaluation"]``: every central and
    federated metric, and each asked site's evaluation (``fedweave/history/metrics.py``
    reads them back)."""
    if not (summary.central or summary.federated or summary.evaluations):
        return {}
    return {
        "evaluation": {
            "central": summary.central,
            "federated": summary.federated,
            "sites": [
                {
                    "site": site.site_id,
                    "status": site.status,
                    "examples": site.num_examples,
                    "metrics": site.metrics,
                    **({"reason": site.reason} if site.reason else {}),
                }
                for site in summary.evaluations
            ],
            **({"cross_site": [_cross_site_entry(site) for site in summary.cross_site]}
               if summary.cross_site else {}),
        }
    }


def _cross_site_entry(site: Any) -> dict[str, Any]:
    metrics = {k: v for k, v in site.metrics.items() if k not in ("model", "node_id")}
    return {
        "model": site.metrics.get("model"),
        "site": site.site_id,
        "status": site.status,
        "examples": site.num_examples,
        "metrics": metrics,
        **({"reason": site.reason} if site.reason else {}),
    }


class HistoryRecorder:
    """A round listener: write the checkpoint file (atomically), then record the round.

    The checkpoint reaches the disk before the round's rows are committed, and the rows
    (round, site results, checkpoint reference) commit together; a crash in between leaves
    an unreferenced file, never a round without its checkpoint.

    Args:
        store: an open ``fedweave.history.HistoryStore``.
        run_id: the run being recorded.
        checkpoint_dir: directory for checkpoints (``<dir>/<run_id>/round-00001.npz``).
        retry_seconds: how long a lost database is retried before the run fails (default 30).
        tracker: optional MLflow/TensorBoard mirror (``fedweave.history.tracking``), told
            about each round after it is recorded.
    """

    def __init__(
        self, store, run_id: str, checkpoint_dir: Path, retry_seconds: float = 30.0, tracker=None
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.checkpoint_dir = checkpoint_dir
        self.retry_seconds = retry_seconds
        self.tracker = tracker
        self.checkpoint_bytes = 0  # the last checkpoint's size: what the next one will take

    def space_problem(self, pending: int = 0) -> str | None:
        """One line when the checkpoint folder has less room than the next round's
        checkpoint (the last one's size) takes beside the ``pending`` rounds' still being
        written, so the next round is not trained only to be thrown away; ``None`` while
        there is room, or before any checkpoint."""
        import shutil

        if not self.checkpoint_bytes:
            return None
        try:
            free = shutil.disk_usage(self.checkpoint_dir).free
        except OSError:
            return None
        if free >= (pending + 1) * self.checkpoint_bytes + SPACE_MARGIN_BYTES:
            return None
        return (
            f"the next round's checkpoint takes about {self.checkpoint_bytes / 1e6:.1f} MB in "
            f"{self.checkpoint_dir}"
            + (f" beside {pending} round(s) still being written" if pending else "")
            + f", and {free / 1e6:.1f} MB are free there: free space (or "
            "choose another --checkpoint-dir), then resume the run; the rounds before it are "
            "recorded"
        )

    def on_round_start(self, started: RoundInFlight) -> None:
        """Note the round under way (for a live view); a database hiccup costs only the note,
        never the run: the round itself is recorded, with its retries, when it ends."""
        from fedweave.history.store_errors import HistoryError

        try:
            self.store.note_round_started(self.run_id, started)
        except HistoryError as exc:
            log.warning("round %d's start not noted in the history: %s", started.round, exc)

    def on_round(self, summary: RoundSummary) -> None:
        path = checkpoint_path(self.checkpoint_dir, self.run_id, summary.round)
        try:
            file_sha256, size = save_weights_npz(path, summary.weights)
        except OSError as exc:
            raise HistoryError(checkpoint_problem(path, summary, exc)) from None
        self.checkpoint_bytes = size
        record = RoundRecord(
            round=summary.round,
            actor=COORDINATOR_ACTOR,
            started_at=summary.started_at,
            ended_at=summary.ended_at,
            sampled=summary.sampled,
            replied=summary.replied,
            failed=summary.sampled - summary.replied,
            train_metrics=summary.train_metrics,
            eval_loss=summary.loss,
            eval_accuracy=summary.accuracy,
            model_sha256=weights_sha256(summary.weights),
            bytes_in=summary.bytes_in,
            bytes_out=summary.bytes_out,
            extra={
                "seconds": summary.seconds,
                "deadline_seconds": summary.deadline_seconds,
                **(
                    {"simulated_seconds": summary.simulated_seconds,
                     "simulated_clock": summary.simulated_clock}
                    if summary.simulated_clock is not None
                    else {}
                ),  # fmt: skip
                "warnings": summary.warnings,
                **({"failed": summary.failed} if summary.failed else {}),
                **({"statistics": summary.statistics} if summary.statistics else {}),
                **({"privacy": summary.privacy} if summary.privacy is not None else {}),
                **evaluation_extra(summary),
            },
        )
        checkpoint = CheckpointRef(summary.round, str(path.resolve()), file_sha256, size)
        self.store.record_round(self.run_id, record, summary.sites, checkpoint, self.retry_seconds)
        if self.tracker is not None:
            self.tracker.log_round(record)


SPACE_MARGIN_BYTES = 1_000_000
"""Room kept beyond a checkpoint's size (the history database's rows, the file system's own)."""


def checkpoint_problem(path: Path, summary: RoundSummary, exc: OSError) -> str:
    """One line for a round's checkpoint that could not be written: the file, why, and the
    space a round's checkpoint takes beside what is free there."""
    import shutil

    needs = sum(int(np.asarray(w).nbytes) for w in summary.weights)
    try:
        free = f", {shutil.disk_usage(path.parent).free / 1e6:.1f} MB free"
    except OSError:
        free = ""
    return (
        f"cannot write round {summary.round}'s checkpoint {path} "
        f"({exc.strerror or type(exc).__name__}): each round's takes about {needs / 1e6:.1f} "
        f"MB there{free}; free space (or choose another --checkpoint-dir), then resume the "
        "run; the rounds before it are recorded"
    )


class BackgroundRecorder:
    """Runs a round listener on a writer thread, so recording overlaps the next round (and
    its round starts, in order with the rounds, when it has ``on_round_start``).

    Rounds are handed over in order and written in order; at most ``max_pending`` wait
    (default 2), after which the coordinator waits instead of running ahead. A failed write
    (say the database stayed away past its retry budget) is raised at the next round or at
    ``flush()``, so the run stops as failed with that reason.
    """

    def __init__(self, listener, max_pending: int = 2) -> None:
        import queue
        import threading

        self.listener = listener
        self._queue: queue.Queue[RoundSummary | RoundInFlight | None] = queue.Queue(
            maxsize=max_pending
        )
        self._error: BaseException | None = None
        self._rounds_pending = 0  # handed over, not yet written
        self._pending_lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, name="history-writer", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            summary = self._queue.get()
            try:
                if isinstance(summary, RoundInFlight) and self._error is None:
                    self.listener.on_round_start(summary)
                elif summary is not None and self._error is None:
                    self.listener.on_round(summary)
            except BaseException as exc:  # noqa: BLE001 - handed to the coordinator's thread
                self._error = exc
            finally:
                if isinstance(summary, RoundSummary):
                    with self._pending_lock:
                        self._rounds_pending -= 1
                self._queue.task_done()
            if summary is None:
                return

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def on_round(self, summary: RoundSummary) -> None:
        self._raise_if_failed()
        with self._pending_lock:
            self._rounds_pending += 1
        self._queue.put(summary)

    def on_round_start(self, started: RoundInFlight) -> None:
        self._raise_if_failed()  # a round whose predecessor was not recorded is not started
        space = getattr(self.listener, "space_problem", None)
        problem = space(self._rounds_pending) if callable(space) else None
        if problem is not None:
            raise HistoryError(problem)
        if hasattr(self.listener, "on_round_start"):
            self._queue.put(started)

    def flush(self) -> None:
        """Wait until every handed-over round is written; raise the first write failure."""
        self._queue.join()
        self._raise_if_failed()

    def close(self, timeout: float = 60.0) -> None:
        """Write what is pending, then stop the writer thread (waits at most ``timeout`` s)."""
        self._queue.put(None)
        self._thread.join(timeout)
