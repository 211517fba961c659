"""What gossip could reach at best: idealised gossip in one process, no sockets, no timing.

Ten sites train the digits model exactly as in ``bench_gossip_vs_fedavg.py`` (1 local epoch,
lr 0.1, batch 16, same Dirichlet split), and after each round the models are mixed by one of
these rules, each exchange atomic and instantaneous:

- ``synchronous``: all sites train, then every site in turn averages pairwise (weighted by
  examples) with ``fanout`` random others, then all are evaluated. Slotted rounds
  (``--round-interval``) approximate this.
- ``asynchronous``: sites take turns; each trains, averages with ``fanout`` random others and is
  evaluated at once, while the others still carry their fresh local training. Back-to-back
  rounds on real peers look like this.

It prints, per seed, the rounds each rule needs to reach FedAvg's 20-round accuracy ÷ 20 (the
ratio ``bench_gossip_vs_fedavg.py`` measures on real peers) and the median over seeds: the floor
that no implementation of that mixing can beat on this data.

    python bench/bench_gossip_mixing_bound.py [--seeds 0,1,2] [--fanouts 2,3,4]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import numpy as np

from fedweave.learning.tasks import load_task
from fedweave.learning.training import TrainConfig
from fedweave.learning.weights import get_weights, set_weights
from fedweave.simulations.partition import partition_indices

SITES, FED_ROUNDS, MAX_ROUNDS = 10, 20, 60


def run(seed: int, rule: str, fanout: int, rounds: int) -> list[float]:
    """Mean test accuracy of the sites' own models after each round."""
    import torch

    task = load_task("digits")
    train, test = task.load_data()
    data = [train.subset(p) for p in partition_indices(train.y, SITES, "dirichlet", 0.5, 2, seed)]
    n = np.array([len(d) for d in data], dtype=float)
    torch.manual_seed(seed)
    model = task.build_model()
    models = [get_weights(model) for _ in range(SITES)]
    config = TrainConfig(epochs=1, batch_size=16, lr=0.1, device="cpu", seed=seed)
    rng = np.random.default_rng(seed)

    def train_site(i: int, r: int) -> None:
        set_weights(model, models[i])
        task.train(model, data[i], dataclasses.replace(config, seed=int(seed * 1000 + r * 10 + i)))
        models[i] = get_weights(model)

    def average(i: int, j: int) -> None:
        mean = [(n[i] * a + n[j] * b) / (n[i] + n[j]) for a, b in zip(models[i], models[j])]
        models[i], models[j] = mean, [a.copy() for a in mean]

    def partners(i: int) -> list[int]:
        return list(rng.choice([j for j in range(SITES) if j != i], fanout, replace=False))

    def accuracy(i: int) -> float:
        set_weights(model, models[i])
        return task.evaluate(model, test, config)["accuracy"]

    curve = []
    for r in range(1, rounds + 1):
        if rule == "fedavg":
            for i in range(SITES):
                train_site(i, r)
            mean = [
                sum(n[i] * models[i][k] for i in range(SITES)) / n.sum()
                for k in range(len(models[0]))
            ]
            models = [[a.copy() for a in mean] for _ in range(SITES)]
            curve.append(accuracy(0))
        elif rule == "synchronous":
            for i in range(SITES):
                train_site(i, r)
            for i in rng.permutation(SITES):
                for j in partners(i):
                    average(i, j)
            curve.append(statistics.mean(accuracy(i) for i in range(SITES)))
        else:
            scores = []
            for i in rng.permutation(SITES):
                train_site(i, r)
                for j in partners(i):
                    average(i, j)
                scores.append(accuracy(i))
            curve.append(statistics.mean(scores))
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--fanouts", default="2,3,4")
    args = parser.parse_args()
    fanouts = [int(f) for f in args.fanouts.split(",")]
    ratios: dict[tuple[str, int], list[float]] = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        target = run(seed, "fedavg", 0, FED_ROUNDS)[-1]
        print(f"seed {seed}: FedAvg after {FED_ROUNDS} rounds {target:.4f}")
        for rule in ("synchronous", "asynchronous"):
            for fanout in fanouts:
                curve = run(seed, rule, fanout, MAX_ROUNDS)
                reached = next((r + 1 for r, acc in enumerate(curve) if acc >= target), None)
                ratio = reached / FED_ROUNDS if reached else float("inf")
                ratios.setdefault((rule, fanout), []).append(ratio)
                print(f"  {rule:>12} fanout {fanout}: rounds ratio {ratio:.2f}", flush=True)
    print("median rounds ratio (gossip / FedAvg) over seeds:")
    for (rule, fanout), values in ratios.items():
        print(f"  {rule:>12} fanout {fanout}: {statistics.median(values):.2f}")


if __name__ == "__main__":
    main()
