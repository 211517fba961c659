"""Per-round time with SecAgg+ / without, 10 sites, a ~1.2M-parameter model, same data.

Runs the same federated simulation (digits, an MLP widened to ~1.2M parameters) with and
without SecAgg+, alternating, and compares the median round time after round 1 (round 1
carries Ray's start-up). Prints the ratio (goal <= 1.3; stock Flower measured 1.72 here).

    python bench/bench_secagg.py --clients 10 --rounds 6 --trials 2 [--hidden 1070]
"""

from __future__ import annotations

import argparse
import statistics

from fedweave.learning.tasks.digits import DigitsTask

WIDE_HIDDEN = 1070


class WideDigits(DigitsTask):
    """Digits with two hidden layers of 1070 units: 1.23M parameters."""

    name = "digits-wide"

    def __init__(self) -> None:
        super().__init__(hidden=WIDE_HIDDEN)


def round_seconds(secure: bool, clients: int, rounds: int) -> list[float]:
    from fedweave.config import RunConfig
    from fedweave.simulations.federated import run_federated_simulation

    config = RunConfig.of(
        task="bench_secagg:WideDigits",
        clients=clients,
        rounds=rounds,
        partition="iid",
        secure_agg=secure,
        lr=0.02,
    )
    rows = run_federated_simulation(config)
    return [row["seconds"] for row in rows[1:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args()
    params = sum(p.numel() for p in WideDigits().build_model().parameters())
    times: dict[bool, list[float]] = {True: [], False: []}
    for trial in range(args.trials):
        for secure in (False, True) if trial % 2 == 0 else (True, False):
            seconds = round_seconds(secure, args.clients, args.rounds)
            times[secure].extend(seconds)
            print(
                f"trial {trial + 1} {'SecAgg+' if secure else 'plain  '} median round "
                f"{statistics.median(seconds):.3f}s",
                flush=True,
            )
    plain, secure = statistics.median(times[False]), statistics.median(times[True])
    print(f"clients={args.clients} params={params:,} rounds={args.rounds} trials={args.trials}")
    print(f"median round: plain {plain:.3f}s, SecAgg+ {secure:.3f}s")
    print(f"SecAgg+ / plain = {secure / plain:.3f} (goal <= 1.3)")


if __name__ == "__main__":
    main()
