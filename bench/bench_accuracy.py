"""Federated vs centralized accuracy on the same model, data and number of epochs.

Runs a fedweave federated simulation (Flower simulation engine, FedAvg) and then trains the
same model centrally on the union of the sites' data for rounds x local-epochs epochs with
the same optimiser settings, and prints both accuracies and the difference (goal: within
1 point).

    python bench/bench_accuracy.py --task digits --clients 10 --rounds 20 --alpha 0.5 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from fedweave.config import SETTINGS, RunConfig
from fedweave.coordinator.rounds.round_app import initial_weights
from fedweave.learning.data import load_site_data
from fedweave.learning.task import ArrayData
from fedweave.learning.tasks import load_task
from fedweave.learning.training import TrainConfig
from fedweave.learning.weights import set_weights
from fedweave.simulations.federated import run_federated_simulation
from fedweave.simulations.split import test_file


def centralized_accuracy(config: RunConfig, split_dir: Path) -> float:
    data, training = config.data, config.training
    task = load_task(data.task)
    sites = [load_site_data(split_dir / f"site-{i}.npz", task) for i in range(data.clients)]
    union = ArrayData(np.concatenate([s.x for s in sites]), np.concatenate([s.y for s in sites]))
    test = load_site_data(test_file(split_dir), task)
    model = task.build_model()
    set_weights(model, initial_weights(config))
    train_config = TrainConfig(
        epochs=training.rounds * training.local_epochs,
        lr=training.lr,
        batch_size=training.batch_size,
        seed=training.seed,
    )
    task.train(model, union, train_config)
    return task.evaluate(model, test, train_config)["accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="digits")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--partition", default="dirichlet")
    parser.add_argument("--local-epochs", type=int, default=SETTINGS["local_epochs"].default)
    parser.add_argument("--lr", type=float, default=SETTINGS["lr"].default)
    parser.add_argument("--batch-size", type=int, default=SETTINGS["batch_size"].default)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated; the mean is the figure")
    args = parser.parse_args()
    differences = []
    for seed in (int(s) for s in args.seeds.split(",")):
        differences.append(run_one(args, seed))
    print(
        f"mean difference over seeds {args.seeds}: {sum(differences) / len(differences):+.2f} "
        "points (goal: |difference| <= 1.00)"
    )


def run_one(args: argparse.Namespace, seed: int) -> float:
    config = RunConfig.of(
        task=args.task,
        clients=args.clients,
        rounds=args.rounds,
        partition=args.partition,
        alpha=args.alpha,
        local_epochs=args.local_epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=seed,
    )
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_federated_simulation(config, split_dir=Path(tmp))
        central = centralized_accuracy(config, Path(tmp))
    federated = rows[-1]["accuracy"]
    data, training = config.data, config.training
    print(
        f"seed={seed} task={data.task} clients={data.clients} rounds={training.rounds} "
        f"partition={data.partition} alpha={data.alpha} local_epochs={training.local_epochs} "
        f"lr={training.lr} batch={training.batch_size}"
    )
    print(f"federated final accuracy   {federated:.4f}")
    epochs = training.rounds * training.local_epochs
    print(f"centralized accuracy       {central:.4f}  ({epochs} epochs)")
    difference = 100 * (central - federated)
    print(f"difference (central - fed) {difference:+.2f} points")
    return difference


if __name__ == "__main__":
    main()
