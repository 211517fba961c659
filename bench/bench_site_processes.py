"""Deployed rounds with one site training across processes (issue 37): a coordinator and 3
sites on loopback with TLS, site keys and SecAgg+, site 0 at ``--nproc-per-node N`` (gloo on
this machine's CPUs) and the others at 1, against the same run with every site at 1.

    python bench/bench_site_processes.py [--nproc 2] [--rounds 3] [--local-epochs 10]
        [--task digits]

Each run is ``bench_large_model.run`` (``fedweave coordinator`` and ``fedweave client`` as
docs/deploy.md sets them up, federated evaluation off). It prints, per round, the round's
seconds, site 0's own training seconds (its rank 0's ``train_epochs`` time, which leaves out
the ranks' start) and the central accuracy, then the medians of rounds 2..R of both runs.
On a machine with 2 cores the ranks share the cores the single process had: the figure here
is the cost of the processes (their start each round, the all-reduce each step), not a
speed-up; on GPUs ``bench/bench_gpu_training.py`` measures the training's own scaling.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench_deployment import prepare
from bench_large_model import run

from fedweave.history import open_store

HERE = Path(__file__).resolve().parent


def site_zero_seconds(work: Path) -> dict[int, float]:
    """Round -> site 0's training seconds, from the newest history in ``work``."""
    db = max(work.glob("run-*.db"), key=lambda path: path.stat().st_mtime)
    with open_store(f"sqlite:///{db}") as store:
        run_id = store.list_runs()[0].run_id
        rows = store.site_results(run_id)
    return {
        row["round"]: float(row["seconds"] or 0.0)
        for row in rows if row["site_id"] == "site0"
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2, help="site 0's --nproc-per-node")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-epochs", type=int, default=10)
    parser.add_argument("--task", default="digits")
    args = parser.parse_args()
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "PYTHONPATH": path}  # fmt: skip
    print(f"{args.task}, 3 sites, TLS and SecAgg+, {args.local_epochs} local epochs, "
          f"{os.cpu_count()} cores")  # fmt: skip
    medians = {}
    with tempfile.TemporaryDirectory(prefix="fedweave-bench-processes-") as tmp:
        work = Path(tmp)
        prepare(work, 3, env, args.task)
        for nproc in (1, args.nproc):

            def site_command(index: int, argv: list[str], nproc: int = nproc) -> list[str]:
                return [*argv, "--nproc-per-node", str(nproc)] if index == 0 else argv

            rounds = run(work, 3, args.rounds, True, env, task=args.task,
                         coordinator_extra=["--local-epochs", str(args.local_epochs)],
                         site_command=site_command)  # fmt: skip
            site0 = site_zero_seconds(work)
            label = f"site 0 at --nproc-per-node {nproc}"
            for row in rounds:
                print(f"{label}: round {row['round']} {row['seconds']:5.1f} s, site 0 trained "
                      f"{site0.get(row['round'], 0.0):5.2f} s, accuracy "
                      f"{row['accuracy']:.3f}", flush=True)  # fmt: skip
            later = rounds[1:] or rounds
            medians[nproc] = (
                statistics.median(r["seconds"] for r in later),
                statistics.median(site0.get(r["round"], 0.0) for r in later),
            )
    for nproc, (seconds, trained) in medians.items():
        print(f"site 0 at --nproc-per-node {nproc}: median round {seconds:.1f} s, site 0's "
              f"training {trained:.2f} s (rounds 2..{args.rounds})")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
