"""Run a federated simulation with a live progress view and write its report."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from client.task import load_task
from coordinator.rounds import RoundSummary
from fedweave.errors import UserError
from simulations.federated import FederatedSimulation, run_federated_simulation
from simulations.report import RoundProgress, build_report, rounds_table, write_report


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


def run_and_report(sim: FederatedSimulation, out: Path) -> dict:
    """Run ``sim`` showing progress, print the per-round table, write the report to ``out``."""
    console = Console(stderr=True)
    train, _ = load_task(sim.task).load_data()  # bad task or sizes fail here, before Ray starts
    if sim.clients > len(train):
        raise UserError(
            f"--clients {sim.clients} is more than the {len(train)} training examples of "
            f"'{sim.task}'; use fewer clients"
        )
    started = time.perf_counter()
    with RoundProgress(sim.rounds, f"federated {sim.task}", console) as progress:
        rows = run_federated_simulation(sim, listeners=[_ProgressListener(progress)])
    report = build_report(
        "federated",
        sim.task,
        sim.clients,
        rows,
        config=asdict(sim),
        wall_seconds=time.perf_counter() - started,
    )
    write_report(out, report)
    console.print(rounds_table(rows, title=f"federated {sim.task}: {sim.clients} sites"))
    console.print(f"final accuracy {report['final_accuracy']:.4f}; report written to {out}")
    return report
