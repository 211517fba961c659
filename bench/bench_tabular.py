"""Hospitals' own CSVs, standardised together, against a model trained centrally.

Three hospitals' files of the ``breast-cancer`` table (unequal sizes; one with its columns
in another order, one with an extra patient-id column) train federated with
``fedweave simulate --data-dir`` (SecAgg+ on, the feature statistics gathered through it),
and without standardisation (``breast-cancer-raw``) for contrast. The reference is the same
model trained centrally on the pooled files, standardised with the pooled statistics, for as
many epochs as the federation's rounds x local epochs. Prints accuracy on the held-out
test file per seed and the federated-minus-central difference in points (goal: >= -1).

    python bench/bench_tabular.py [--rounds 10] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from fedweave.learning.statistics import local_only_statistics
from fedweave.learning.tables import Table
from fedweave.learning.tasks import load_task
from fedweave.learning.tasks.breast_cancer import write_hospital_files
from fedweave.learning.training import TrainConfig, seed_everything


def central_accuracy(sites: list[Path], test: Path, epochs: int, seed: int) -> float:
    return central_scores(load_task("breast-cancer"), sites, test, epochs, seed)["accuracy"]


def central_scores(task, sites: list[Path], test: Path, epochs: int, seed: int) -> dict:  # type: ignore[no-untyped-def]
    """Every metric of ``task``'s model trained centrally on the pooled ``sites`` files for
    ``epochs`` (standardised with the pooled statistics), on the ``test`` file."""
    tables = [task.read_site_data(p) for p in sites]
    pooled = Table(
        np.concatenate([t.numeric for t in tables]),
        np.concatenate([t.categorical for t in tables]),
        np.concatenate([t.labels for t in tables]),
        "pooled",
    )
    statistics = local_only_statistics(task, pooled)
    seed_everything(seed)
    model = task.build_model()
    config = TrainConfig.for_task(task, epochs=epochs, device="cpu", seed=seed)
    task.train(model, task.prepare(pooled, statistics), config)
    test_data = task.prepare(task.read_site_data(test), statistics)
    return task.evaluate(model, test_data, config)


def federated_accuracy(task: str, site_dir: Path, test: Path, rounds: int, seed: int,
                       *extra: str) -> float:  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        done = subprocess.run(
            [sys.executable, "-m", "fedweave.cli", "simulate", "--task", task,
             "--data-dir", str(site_dir), "--test-data", str(test), "--rounds", str(rounds),
             "--seed", str(seed), "--db", f"sqlite:///{tmp}/h.db", "--out", str(out), *extra],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(done.stderr[-2000:])
        return json.loads(out.read_text())["final_accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        sites, test = write_hospital_files(Path(tmp) / "sites")
        sizes = ", ".join(str(sum(1 for _ in open(p)) - 1) for p in sites)
        print(f"sites: {sizes} patients; test: {sum(1 for _ in open(test)) - 1}")
        print(f"{'seed':>4} {'central':>8} {'fed SecAgg+':>12} {'fed plain':>10} "
              f"{'fed raw':>8} {'diff (pts)':>11}")  # fmt: skip
        diffs = []
        for seed in args.seeds:
            central = central_accuracy(sites, test, args.rounds, seed)
            secure = federated_accuracy("breast-cancer", sites[0].parent, test, args.rounds, seed)
            plain = federated_accuracy(
                "breast-cancer", sites[0].parent, test, args.rounds, seed, "--no-secure-agg"
            )
            raw = federated_accuracy("breast-cancer-raw", sites[0].parent, test, args.rounds, seed)
            diffs.append(100 * (secure - central))
            print(f"{seed:>4} {central:>8.4f} {secure:>12.4f} {plain:>10.4f} {raw:>8.4f} "
                  f"{diffs[-1]:>+11.2f}")  # fmt: skip
        print(f"federated (SecAgg+) minus central, mean over seeds: {np.mean(diffs):+.2f} points")


if __name__ == "__main__":
    main()
