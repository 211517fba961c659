"""Where a peer's rounds go: the SQL history (``fedweave.history``), and for simulations a
JSON-lines results file plus per-round model dumps (for the consensus distance).

History writes sit behind ``open_history`` so the peer loop never touches the store directly.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedweave.errors import UserError

log = logging.getLogger("fedweave.gossip")


class HistoryWriter:
    """Round records of one peer in one run of the SQL history.

    A round that cannot be written (database down for more than 2 s, duplicate) is logged and
    skipped: the peer keeps gossiping, because a central database must not become the single
    point of failure gossip mode exists to avoid.
    """

    def __init__(self, store: Any, run_id: str, owns_run: bool) -> None:
        self.store, self.run_id, self.owns_run = store, run_id, owns_run

    def record(self, record: Any, sites: list[Any]) -> None:
        try:
            self.store.record_round(
                self.run_id, record, sites=sites, checkpoint=None, retry_seconds=2.0
            )
        except Exception as exc:  # a history outage must not stall or kill the gossip
            log.warning("round %s not recorded in the history: %s", record.round, exc)

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
    try:
        from fedweave.history import open_store
    except ImportError as exc:  # pragma: no cover - the store ships with fedweave
        raise UserError(f"the history store cannot be loaded ({exc}); run without --db") from exc
    store = open_store(db_url)
    if run_id is not None:
        return HistoryWriter(store, run_id, owns_run=False)
    new_id = store.start_run(mode="gossip", task=task, config=config, seed=seed)
    return HistoryWriter(store, new_id, owns_run=True)


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
            self._handle = path.open("a", encoding="utf-8")
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
