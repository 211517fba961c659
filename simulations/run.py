"""Run a federated simulation as a recorded run: progress, SQL history, resume, report."""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from rich.console import Console

from fedweave.coordinator.rounds import RoundSummary
from fedweave.errors import UserError
from fedweave.learning.task import load_task
from fedweave.simulations.federated import FederatedSimulation, run_federated_simulation
from fedweave.simulations.report import RoundProgress, build_report, rounds_table, write_report

NOT_PART_OF_RUN_IDENTITY = {"verbose", "device", "gpus_per_client", "cpus_per_client"}
"""Settings a resumed run may change: where it runs, not what it computes."""


@dataclass(frozen=True)
class Recording:
    """Where the run is recorded.

    Attributes:
        db_url: SQLAlchemy URL of the history (default ``sqlite:///fedweave.db``).
        checkpoint_dir: where per-round model files go (default ``./checkpoints``).
        resume: a run id (or ``latest``) to continue instead of starting a new run.
        track: also mirror round metrics to ``mlflow`` or ``tensorboard`` (default none).
    """

    db_url: str | None = None
    checkpoint_dir: Path = Path("checkpoints")
    resume: str | None = None
    track: str | None = None


class _ProgressListener:
    def __init__(self, progress: RoundProgress) -> None:
        self.progress = progress

    def on_round(self, summary: RoundSummary) -> None:
        self.progress.update(
            {
                "round": summary.round,
                "accuracy": summary.accuracy,
                "loss": summary.loss,
                "seconds": summary.seconds,
            }
        )


def resumable_simulation(
    run, requested: FederatedSimulation, explicit: set[str]
) -> FederatedSimulation:
    """The simulation to continue ``run`` with: its stored config, where-it-runs settings
    from this command, and a clear refusal when an explicitly given flag contradicts it."""
    if run.mode != "federated":
        raise UserError(f"run {run.run_id} is a {run.mode} run; resume it with --mode {run.mode}")
    if run.status == "completed":
        raise UserError(
            f"run {run.run_id} already completed {run.rounds_completed} rounds; nothing to resume"
        )
    stored: dict[str, Any] = run.config
    known = {f.name for f in fields(FederatedSimulation)}
    values = {k: v for k, v in stored.items() if k in known}
    conflicts = [
        f"--{name.replace('_', '-')} {getattr(requested, name)} (run has {values.get(name)})"
        for name in sorted(explicit & known - NOT_PART_OF_RUN_IDENTITY)
        if name in values and values[name] != getattr(requested, name)
    ]
    if conflicts:
        raise UserError(
            f"cannot resume run {run.run_id} with a different config: {'; '.join(conflicts)}; "
            "drop those flags to continue it as it was"
        )
    for name in NOT_PART_OF_RUN_IDENTITY:
        values[name] = getattr(requested, name)
    return FederatedSimulation(**values)


def run_and_report(
    sim: FederatedSimulation, out: Path, recording: Recording, explicit: set[str] = frozenset()
) -> dict:
    """Run ``sim`` (or resume a recorded run) with progress; record each round; write the report."""
    from fedweave.coordinator.history_recorder import (
        BackgroundRecorder,
        HistoryRecorder,
        resume_point,
    )
    from fedweave.history import open_store
    from fedweave.history.tracking import make_tracker

    console = Console(stderr=True)
    store = open_store(recording.db_url)  # an unreachable DB fails here, before any training
    start_weights, offset = None, 0
    if recording.resume:
        run = store.get_run(recording.resume)
        sim = resumable_simulation(run, sim, set(explicit))
        run_id = run.run_id
        start_weights, offset = resume_point(store, run_id)
        store.mark_running(run_id)
        console.print(f"resuming run {run_id} after round {offset} of {sim.rounds}")
    train, _ = load_task(sim.task).load_data()  # bad task or sizes fail here, before Ray starts
    if sim.clients > len(train):
        raise UserError(
            f"--clients {sim.clients} is more than the {len(train)} training examples of "
            f"'{sim.task}'; use fewer clients"
        )
    if not recording.resume:
        run_id = uuid.uuid4().hex[:12]
    tracker = make_tracker(recording.track, run_id, asdict(sim))  # a missing package fails here
    if not recording.resume:
        store.start_run("federated", sim.task, asdict(sim), sim.seed, run_id=run_id)
        console.print(f"run {run_id} recorded in the history")
    recorder = BackgroundRecorder(
        HistoryRecorder(store, run_id, recording.checkpoint_dir, tracker=tracker)
    )
    started = time.perf_counter()
    try:
        with RoundProgress(sim.rounds, f"federated {sim.task}", console) as progress:
            progress.set_completed(offset)
            rows = run_federated_simulation(
                sim,
                listeners=[recorder, _ProgressListener(progress)],
                start_weights=start_weights,
                round_offset=offset,
            )
        recorder.flush()
    except KeyboardInterrupt:
        recorder.close()
        store.finish_run(run_id, "interrupted", "stopped by the user (Ctrl-C)")
        console.print(f"run {run_id} interrupted; continue it with --resume {run_id}")
        raise
    except Exception as exc:
        recorder.close()
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        store.finish_run(run_id, "failed", reason)
        raise
    recorder.close()
    if tracker is not None:
        tracker.close()
    history_rows = [
        {
            "round": r["round"],
            "accuracy": r["eval_accuracy"],
            "loss": r["eval_loss"],
            "seconds": (r.get("extra") or {}).get("seconds"),
        }
        for r in store.rounds(run_id)
    ]
    store.finish_run(run_id, "completed")
    report = build_report(
        "federated",
        sim.task,
        sim.clients,
        history_rows if recording.resume else rows,
        run_id=run_id,
        config=asdict(sim),
        wall_seconds=time.perf_counter() - started,
    )
    write_report(out, report)
    console.print(
        rounds_table(report["rounds"], title=f"federated {sim.task}: {sim.clients} sites")
    )
    console.print(
        f"final accuracy {report['final_accuracy']:.4f}; run {run_id}; report written to {out}"
    )
    store.close()
    return report
