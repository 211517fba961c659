"""FedProx against FedAvg with stragglers on synthetic-1-1 (the FedProx paper's Figure 1 setting).

Each round samples --per-round of --clients sites; --stragglers of them finish only a random
part of their local work. FedAvg drops them (as the paper's FedAvg does), FedProx (mu) counts
their partial work. Prints test accuracy per round for each strategy and seed, then the mean
over seeds of the last --tail rounds.

    python bench/bench_stragglers.py --rounds 40 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

from fedweave.config import RunConfig
from fedweave.simulations.federated import run_federated_simulation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="synthetic-1-1")
    parser.add_argument("--clients", type=int, default=30, help="the paper's 30 devices")
    parser.add_argument("--per-round", type=int, default=10, help="the paper's 10 a round")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--local-epochs", type=int, default=5, help="the paper uses 20")
    parser.add_argument("--lr", type=float, default=0.01, help="the paper's 0.01")
    parser.add_argument("--batch-size", type=int, default=10, help="the paper's 10")
    parser.add_argument("--stragglers", type=float, default=0.5)
    parser.add_argument("--mu", type=float, default=1.0, help="FedProx's mu (paper: 1)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--tail", type=int, default=10, help="rounds averaged at the end")
    args = parser.parse_args()
    logging.getLogger("fedweave").setLevel(logging.WARNING)
    curves: dict[str, list[list[float]]] = {"fedavg": [], "fedprox": []}
    for seed in (int(s) for s in args.seeds.split(",")):
        for strategy in curves:
            config = RunConfig.of(
                mode="federated", task=args.task, clients=args.clients,
                clients_per_round=args.per_round, rounds=args.rounds,
                local_epochs=args.local_epochs, lr=args.lr, batch_size=args.batch_size,
                seed=seed, strategy=strategy, proximal_mu=args.mu,
                stragglers=args.stragglers, secure_agg=False, db="none",
            )  # fmt: skip
            rows = run_federated_simulation(config)
            accuracy = [row["accuracy"] for row in rows]
            curves[strategy].append(accuracy)
            print(f"{strategy:8s} seed {seed}: " + " ".join(f"{a:.3f}" for a in accuracy),
                  flush=True)  # fmt: skip
    print(
        f"\n{args.task}, {args.clients} sites, {args.per_round} a round, {args.rounds} rounds, "
        f"E={args.local_epochs}, {100 * args.stragglers:g}% stragglers, mu={args.mu:g}"
    )
    for strategy, runs in curves.items():
        tail = [np.mean(run[-args.tail :]) for run in runs]
        print(
            f"{strategy:8s} mean test accuracy, last {args.tail} rounds: "
            f"{np.mean(tail):.3f} (per seed: {', '.join(f'{t:.3f}' for t in tail)})"
        )


if __name__ == "__main__":
    main()
