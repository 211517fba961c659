"""Gossip against FedBuff at sites of unequal speed, in real time (issue 24).

The same sites for both: the same split (``--task``, iid, seed 0) and local training, and
each site held to its own share of the machine's CPU by a cgroup CPU quota, drawn from a
heavy-tailed spread
(``--speeds``, as ``--site-speeds`` draws a site's compute factor: a site ``f`` times slower
gets ``--share / f`` of a CPU). Both run as real processes:

- **FedBuff**, deployed: ``fedweave coordinator --schedule async --buffer K`` and one
  ``fedweave client`` per site on loopback, TLS and site keys on (``bench_deployment.py``'s
  setup), plain (``--no-secure-agg``) and, with ``--secure``, under SecAgg+ too; central test
  accuracy of the global model after each step.
- **Gossip**: ``fedweave simulate --mode gossip``'s peers, each in a network namespace of its
  own on a bridge (as one machine a site; ``simulations/netns.py``), CURVE on. Its accuracy
  after a round is the mean test accuracy of the peers' own models, and ``network`` that of
  the peers' mean model; a round's time is when its last peer finished it, from when the
  first peer began round 1.

Prints each one's wall seconds (from its first step or round: neither counts start-up) to
``--target`` and its final accuracy. Needs root (cgroups, namespaces).

    python bench/bench_uneven_sites.py [--clients 4] [--speeds pareto:1.5] [--target 0.9]
        [--steps 30] [--buffer 2] [--gossip-rounds 30] [--secure] [--gossip-only]
        [--keep DIR] [--json FILE]

Both take the task's own training defaults (``fedweave simulate`` and ``fedweave client``
do); before 2026-12-01 gossip here trained with the generic SGD at 0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from bench_deployment import prepare
from bench_large_model import run as deployed_run

from fedweave.config import RunConfig
from fedweave.config.task_defaults import TASK_DEFAULTED, apply_task_defaults
from fedweave.learning.site_speeds import SiteSpeeds
from fedweave.simulations.cpu_quota import CpuQuota
from fedweave.simulations.netns import Host


@dataclass(frozen=True)
class ThrottledHost(Host):
    """A peer's own network namespace, its processes held to a CPU quota."""

    quota: CpuQuota | None = None

    def command(self, argv: list[str]) -> list[str]:
        return self.quota.command(super().command(argv))


def reached(curve: list[tuple[float, float | None]], target: float) -> float | None:
    """The first time (seconds) at which the accuracy was at least ``target``."""
    return next((t for t, acc in curve if acc is not None and acc >= target), None)


def line(name: str, curve: list[tuple[float, float | None]], target: float) -> str:
    at = reached(curve, target)
    final = curve[-1][1] if curve else None
    return (
        f"{name:16s}: {target:g} at " + (f"{at:6.1f} s" if at is not None else " never  ")
        + f"; final accuracy {final:.4f} after {len(curve)} steps/rounds, "
        f"{curve[-1][0]:.1f} s"
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="digits", help="digits or mnist5k (default digits)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--speeds", default="pareto:1.5", help="the spread of site speeds")
    parser.add_argument("--seed", type=int, default=0,
                        help="the speeds' seed (the split is seed 0 in both)")  # fmt: skip
    parser.add_argument("--share", type=float, default=0.45,
                        help="CPU share of the fastest possible site (default 0.45)")  # fmt: skip
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--steps", type=int, default=30, help="FedBuff's model steps")
    parser.add_argument("--buffer", type=int, default=2)
    parser.add_argument("--gossip-rounds", type=int, default=30)
    parser.add_argument("--secure", action="store_true", help="FedBuff under SecAgg+ too")
    parser.add_argument("--json", type=Path, help="also write the curves and gossip's rows here")
    parser.add_argument("--gossip-only", action="store_true",
                        help="run gossip alone (no FedBuff, no ratio)")  # fmt: skip
    parser.add_argument("--keep", type=Path,
                        help="work in this folder and keep it (peers' logs, records)")  # fmt: skip
    args = parser.parse_args()
    # a kill ends the bench through its finally blocks, which remove namespaces and cgroups
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if os.geteuid() != 0:
        raise SystemExit("needs root: cgroup CPU quotas and network namespaces")
    from fedweave.simulations.netns import bridged_hosts, why_namespaces_unavailable

    if (why := why_namespaces_unavailable()) is not None:
        raise SystemExit(f"no network namespaces here: {why}")
    speeds = SiteSpeeds.parse(args.speeds, args.seed)
    factors = [max(1.0, speeds.factors(f"site-{i}")[0]) for i in range(args.clients)]
    shares = [args.share / f for f in factors]
    print("CPU share of each site: " + ", ".join(f"{s:.3f}" for s in shares), flush=True)
    tag = uuid.uuid4().hex[:6]
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    curves: dict[str, list[tuple[float, float | None]]] = {}
    with ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            work = args.keep
        else:
            temporary = tempfile.TemporaryDirectory(prefix="fedweave-bench-uneven-")
            work = Path(stack.enter_context(temporary))
        quotas = [CpuQuota(f"fedweave-bench-{tag}-{i}", s) for i, s in enumerate(shares)]
        for quota in quotas:
            stack.callback(quota.remove)
        prepare(work, args.clients, env, args.task)
        for secure in () if args.gossip_only else (False, True) if args.secure else (False,):
            rows = deployed_run(
                work, args.clients, args.steps, secure, env, task=args.task,
                coordinator_extra=["--schedule", "async", "--buffer", str(args.buffer)],
                site_command=lambda i, argv: quotas[i].command(argv),
            )  # fmt: skip
            name = "FedBuff, SecAgg+" if secure else "FedBuff"
            curves[name] = [(r["ended_s"], r["accuracy"]) for r in rows]
            print(line(name, curves[name], args.target), flush=True)
        from fedweave.simulations.gossip_simulation import GossipSimulation, run_gossip_simulation

        config = RunConfig.of(
            task=args.task, clients=args.clients, partition="iid", seed=0,
            rounds=args.gossip_rounds, db="none", device="cpu",
        )  # fmt: skip
        # the task's own training defaults, as `fedweave simulate` and FedBuff's sites take
        # them (mnist5k: AdamW at 1e-3; the generic SGD at 0.1 made its CNN diverge alone)
        config = apply_task_defaults(config, set(), {"task", *TASK_DEFAULTED})
        with bridged_hosts(args.clients) as hosts:
            throttled = [ThrottledHost(h.namespace, h.address, q) for h, q in zip(hosts, quotas)]
            report = run_gossip_simulation(GossipSimulation(config, hosts=throttled), work / "g")
        own, network = [], []
        began = min(row["began_at"] for row in report["rounds"])
        for row in report["rounds"]:  # a round's time: when its last peer finished it
            own.append((row["finished_at"] - began, row["accuracy"]))
            network.append((row["finished_at"] - began, row.get("network_accuracy")))
        curves["gossip"], curves["gossip (network)"] = own, network
        if args.json:
            args.json.write_text(json.dumps({"curves": curves, "gossip": report}, default=str))
        print(line("gossip", own, args.target), flush=True)
        print(line("gossip (network)", network, args.target), flush=True)
    if args.gossip_only:
        return
    fedbuff = reached(curves["FedBuff"], args.target)
    for name in ("gossip", "gossip (network)"):
        mine = reached(curves[name], args.target)
        print(f"{name} / FedBuff wall seconds to {args.target:g}: "
              + (f"{mine / fedbuff:.3f}" if mine and fedbuff else "not comparable"))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
