"""A regression table at its task's own defaults, federated against centrally trained (issue 34).

The diabetes clinics of ``bench_dp_tables.py`` (scikit-learn's diabetes table unscaled: 442
patients, 10 measurements, a disease-progression label of 25-346, as four clinics of
40/80/120/150 rows and a test file of the other 52) train with ``fedweave simulate
--data-dir`` at the task's defaults (AdamW lr 0.003, one local epoch, batch 32; SecAgg+ on;
the features and the label standardised with statistics gathered through it). The
reference is the same model trained centrally on the pooled clinics' rows, standardised
with the pooled statistics, for as many epochs as the federation's rounds. Prints test RMSE
and MAE per seed, and the federated / central RMSE ratio (goal: <= 1.10). Predicting the
training mean gives an RMSE of about 78.

    python bench/bench_regression.py [--rounds 20] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dp_tables import write_diabetes  # noqa: E402
from bench_tabular import central_scores  # noqa: E402


def central(root: Path, epochs: int, seed: int) -> dict[str, float]:
    task = importlib.import_module("diabetes_task").task
    sites = sorted((root / "sites").glob("*.csv"))
    return central_scores(task, sites, root / "test.csv", epochs, seed)


def federated(root: Path, rounds: int, seed: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        done = subprocess.run(
            [sys.executable, "-m", "fedweave.cli", "simulate", "--task", "diabetes_task:task",
             "--data-dir", str(root / "sites"), "--test-data", str(root / "test.csv"),
             "--rounds", str(rounds), "--seed", str(seed), "--db", f"sqlite:///{tmp}/h.db",
             "--checkpoint-dir", f"{tmp}/checkpoints", "--out", str(out)],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)},
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(done.stderr[-2000:])
        return json.loads(out.read_text())["final_metrics"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_diabetes(root)
        sys.path.insert(0, str(root))
        print(f"diabetes, 4 clinics (40/80/120/150 rows), test 52 rows, {args.rounds} rounds at "
              "the task's defaults")  # fmt: skip
        print(f"{'seed':>4} {'central rmse':>13} {'mae':>7} {'fed rmse':>9} {'mae':>7} "
              f"{'ratio':>6}")  # fmt: skip
        ratios = []
        for seed in args.seeds:
            alone = central(root, args.rounds, seed)
            together = federated(root, args.rounds, seed)
            ratios.append(together["rmse"] / alone["rmse"])
            print(
                f"{seed:>4} {alone['rmse']:>13.2f} {alone['mae']:>7.2f} "
                f"{together['rmse']:>9.2f} {together['mae']:>7.2f} {ratios[-1]:>6.3f}"
            )
        print(f"federated / central RMSE, mean over seeds: {np.mean(ratios):.3f}")


if __name__ == "__main__":
    main()
