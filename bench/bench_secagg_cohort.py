"""SecAgg+ against plain rounds at 100 sites a round, with SecAgg+'s per-stage profile.

Runs the same federated simulation (default: 1,000 sites, 100 a round, synthetic-1-1) without
and with SecAgg+, in this process, and prints the median seconds per round after round 1
(round 1 carries Ray's start-up), the ratio SecAgg+ / plain (issue 13's goal: <= 2), and the
median wall seconds of each SecAgg+ stage as the coordinator's workflow logs them (key
advertisement, key shares, masked updates with local training, unmasking).

    python bench/bench_secagg_cohort.py --sites 1000 --per-round 100 --rounds 6 [--task mnist5k]
"""

from __future__ import annotations

import argparse
import logging
import statistics


class _StageRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.rounds: list[dict[str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        stages = getattr(record, "stage_seconds", None)
        if stages:
            self.rounds.append(stages)


def run(task: str, sites: int, per_round: int, rounds: int, secure: bool) -> list[float]:
    from fedweave.config import RunConfig
    from fedweave.simulations.federated import run_federated_simulation

    config = RunConfig.of(
        task=task, clients=sites, clients_per_round=per_round, rounds=rounds,
        partition="auto" if task.startswith("synthetic") else "iid", secure_agg=secure, lr=0.01,
    )  # fmt: skip
    return [row["seconds"] for row in run_federated_simulation(config)[1:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="synthetic-1-1")
    parser.add_argument("--sites", type=int, default=1000)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()

    from fedweave.coordinator.rounds.deadlines import STAGES

    stages = _StageRecords()
    secagg_log = logging.getLogger("fedweave.secagg")
    secagg_log.setLevel(logging.DEBUG)
    secagg_log.addHandler(stages)

    plain = run(args.task, args.sites, args.per_round, args.rounds, secure=False)
    secure = run(args.task, args.sites, args.per_round, args.rounds, secure=True)
    plain_s, secure_s = statistics.median(plain), statistics.median(secure)
    print(f"{args.task}: {args.sites} sites, {args.per_round} a round, rounds 2..{args.rounds}")
    print(f"plain   s/round: {plain_s:.3f}  ({', '.join(f'{s:.2f}' for s in plain)})")
    print(f"SecAgg+ s/round: {secure_s:.3f}  ({', '.join(f'{s:.2f}' for s in secure)})")
    for name in STAGES:
        seconds = [r[name] for r in stages.rounds[1:] if name in r]
        if seconds:
            print(f"  {name:<24} {statistics.median(seconds):.3f} s")
    print(f"SecAgg+ / plain = {secure_s / plain_s:.2f} (goal <= 2)")


if __name__ == "__main__":
    main()
