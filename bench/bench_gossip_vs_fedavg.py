"""Benchmarks 2 and 3: gossip vs FedAvg on the same digits split and the same local training.

(2) Rounds gossip needs to reach the accuracy FedAvg reaches in 20 rounds, ÷ 20 (goal ≤ 1.2).
    FedAvg is the real federated simulation (Flower, all sites every round, central test
    accuracy of the global model); gossip's accuracy is the mean test accuracy of the peers'
    own models (``fedweave.simulations.gossip_simulation``), on the very same ``write_split``
    files. The same ratio for the peers' mean model (``network_accuracy``) is printed beside
    it: it shows how much of the gap is the peers' disagreement rather than slower learning.
(3) Wall time per gossip round ÷ per federated round (goal ≤ 0.5), from the same two runs.

Both runs share this machine's cores; on a 2-core box the 10 peers time-share, so (3) is a
pessimistic figure for gossip (on real sites every peer has its own machine).

``--hosts`` runs every peer in a network namespace of its own on a bridge (wildcard listen,
advertised address: the multi-host setup of docs/gossip.md; needs root) instead of loopback.

    python bench/bench_gossip_vs_fedavg.py [--seeds 0,1,2] [--fanout N] [--gossip-rounds 60]
        [--hosts]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from fedweave.config import SETTINGS, RunConfig


def shared_config(args: argparse.Namespace) -> RunConfig:
    """The split and local training both modes run with."""
    return RunConfig.of(
        task="digits",
        clients=args.clients,
        partition=args.partition,
        alpha=args.alpha,
        seed=args.seed,
        local_epochs=1,
        lr=args.lr,
        batch_size=args.batch_size,
    )


def run_fedavg(args: argparse.Namespace) -> list[dict]:
    from fedweave.simulations.federated import run_federated_simulation

    config = shared_config(args).replace(
        rounds=args.fed_rounds,
        device="cpu",
        secure_agg=False,  # the same local training and plain averaging, as gossip does
    )
    return run_federated_simulation(config)


def run_gossip(args: argparse.Namespace) -> dict:
    from fedweave.simulations.gossip_simulation import GossipSimulation, run_gossip_simulation
    from fedweave.simulations.netns import bridged_hosts

    config = shared_config(args).replace(
        rounds=args.gossip_rounds,
        fanout=args.fanout,
        mix=args.mix,
        group_exchange=args.group_exchange,
        round_interval=args.round_interval,
        db="none",
    )
    if not args.hosts:
        return run_gossip_simulation(GossipSimulation(config))
    with bridged_hosts(args.clients) as hosts:
        return run_gossip_simulation(GossipSimulation(config, hosts=hosts))


def compare(args: argparse.Namespace) -> dict:
    """One seed: both runs, the per-round table, and this seed's two ratios."""
    started = time.perf_counter()
    fed = run_fedavg(args)
    fed_wall = time.perf_counter() - started
    started = time.perf_counter()
    gossip = run_gossip(args)
    gossip_wall = time.perf_counter() - started

    target = fed[-1]["accuracy"]
    reached = next((r["round"] for r in gossip["rounds"] if r["accuracy"] >= target), None)
    network_reached = next(
        (r["round"] for r in gossip["rounds"] if r.get("network_accuracy", 0) >= target), None
    )
    fed_sec = statistics.mean(r["seconds"] for r in fed)
    gossip_sec = statistics.mean(r["seconds"] for r in gossip["rounds"])

    print(f"== seed {args.seed}")
    print(f"{'round':>5} {'fedavg acc':>11} {'gossip acc':>11} {'consensus':>10} {'network':>8}")
    for i in range(max(len(fed), len(gossip["rounds"]))):
        f = f"{fed[i]['accuracy']:.4f}" if i < len(fed) else ""
        g = gossip["rounds"][i] if i < len(gossip["rounds"]) else None
        gs = f"{g['accuracy']:.4f}" if g else ""
        cd = f"{g['consensus_distance']:.3f}" if g else ""
        net = f"{g['network_accuracy']:.4f}" if g and "network_accuracy" in g else ""
        print(f"{i + 1:>5} {f:>11} {gs:>11} {cd:>10} {net:>8}")
    print(f"FedAvg accuracy after {args.fed_rounds} rounds: {target:.4f}")
    if reached is None:
        best = max(r["accuracy"] for r in gossip["rounds"])
        print(f"gossip did not reach it in {args.gossip_rounds} rounds (best {best:.4f})")
        rounds_ratio = float("inf")
    else:
        print(f"gossip reached it at round {reached}")
        rounds_ratio = reached / args.fed_rounds
    print(
        f"seconds per round: FedAvg {fed_sec:.3f} (wall {fed_wall:.0f}s incl. start-up), "
        f"gossip {gossip_sec:.3f} (wall {gossip_wall:.0f}s incl. start-up)"
    )
    network_ratio = (
        network_reached / args.fed_rounds if network_reached is not None else float("inf")
    )
    return {
        "seed": args.seed,
        "rounds_ratio": rounds_ratio,
        "network_rounds_ratio": network_ratio,
        "seconds_ratio": gossip_sec / fed_sec,
        "fedavg": fed,
        "gossip": gossip,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--partition", default="dirichlet")
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated; one split per seed")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--fed-rounds", type=int, default=20)
    parser.add_argument("--gossip-rounds", type=int, default=60)
    parser.add_argument("--fanout", type=int, default=None, help="default: the peer's default")
    parser.add_argument("--mix", default="clipped", help="the peers' --mix (default clipped)")
    parser.add_argument("--group-exchange", action="store_true")
    parser.add_argument("--round-interval", type=float, default=None, help="default: agreed slots")
    parser.add_argument(
        "--hosts", action="store_true", help="one network namespace per peer (needs root)"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write both curves as JSON")
    args = parser.parse_args()
    if args.fanout is None:
        args.fanout = SETTINGS["fanout"].default

    print(
        f"digits, {args.clients} sites, {args.partition} alpha={args.alpha}, lr {args.lr}, "
        f"batch {args.batch_size}, 1 local epoch; gossip fanout {args.fanout} {args.mix}, "
        f"slots {'agreed' if args.round_interval is None else f'{args.round_interval:g}s'}"
        f"{' group exchange' if args.group_exchange else ''}"
        f"; peers {'one per network namespace' if args.hosts else 'on loopback'}"
    )
    results = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        args.seed = seed
        results.append(compare(args))
    print("seed  rounds gossip/FedAvg  (peers' mean model)  seconds per round gossip/FedAvg")
    for r in results:
        print(
            f"{r['seed']:>4}  {r['rounds_ratio']:>20.2f}  {r['network_rounds_ratio']:>19.2f}  "
            f"{r['seconds_ratio']:>31.2f}"
        )
    rounds = statistics.median(r["rounds_ratio"] for r in results)
    seconds = statistics.median(r["seconds_ratio"] for r in results)
    print(f"median ratio rounds gossip / FedAvg (goal <= 1.2): {rounds:.2f}")
    network = statistics.median(r["network_rounds_ratio"] for r in results)
    print(f"  (the same for the peers' mean model, not the goal's measure: {network:.2f})")
    print(f"median ratio seconds per round gossip / FedAvg (goal <= 0.5): {seconds:.2f}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
