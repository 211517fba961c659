"""Does every built-in task train stably with its own defaults? Each over 3 seeds.

Runs ``fedweave simulate`` (SecAgg+ off, for speed; it does not change what a site trains)
with no training flags, so each task's declared ``training_defaults`` apply, and prints the
global model's accuracy per round for each seed, with the largest drop from one round to
the next (a swing of more than 0.1 is what the earlier one-size defaults showed on mnist5k).

    python bench/bench_task_defaults.py [--tasks digits mnist5k synthetic-1-1] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def accuracies(task: str, seed: int, rounds: int, clients: int, *extra: str) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        done = subprocess.run(
            [sys.executable, "-m", "fedweave.cli", "simulate", "--task", task, "--clients",
             str(clients), "--rounds", str(rounds), "--seed", str(seed), "--no-secure-agg",
             "--db", f"sqlite:///{tmp}/h.db", "--out", str(out), *extra],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"{task} seed {seed}: {done.stderr[-1500:]}")
        return [row["accuracy"] for row in json.loads(out.read_text())["rounds"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["digits", "mnist5k", "synthetic-1-1"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--local-epochs", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    for task in args.tasks:
        for epochs in args.local_epochs:
            for seed in args.seeds:
                acc = accuracies(
                    task, seed, args.rounds, args.clients, "--local-epochs", str(epochs)
                )
                drop = max([0.0, *(a - b for a, b in zip(acc, acc[1:]))])
                curve = " ".join(f"{a:.3f}" for a in acc)
                print(f"{task:<14} epochs {epochs} seed {seed}: {curve}  largest drop {drop:.3f}")


if __name__ == "__main__":
    main()
