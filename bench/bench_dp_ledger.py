"""The privacy ledger of a central-DP run against an independent recomputation (issue 33).

    python bench/bench_dp_ledger.py --task digits --clients 10 --rounds 20
    python bench/bench_dp_ledger.py --clients 10 --rounds 20 --target-epsilon 8

Runs one real ``fedweave simulate --dp central`` (SecAgg+ on, the default) into a temporary
history, then recomputes every round's cumulative epsilon from the run's stored settings
alone, with Google's ``dp-accounting`` (not fedweave's code, not Flower's wrapper): the
stored ``noise_multiplier``, the cohort (every site a round here), each round's recorded
``replied`` count (a round some sites missed is a release of multiplier ``Z * n / cohort``)
and its failure (a failed round released nothing), composed by ``dp_accounting.rdp.
RdpAccountant`` without amplification by sampling. Prints, per round, the ledger's epsilon,
the recomputed one and their difference, and last the largest difference and the final
accuracy. The goal: a difference of 0 up to float rounding (below 1e-9).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import dp_accounting

from fedweave.history import open_store


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="digits")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--noise-multiplier", type=float, default=0.8)
    parser.add_argument("--clipping-norm", type=float, default=1.0)
    parser.add_argument("--dp-delta", type=float, default=1e-5)
    parser.add_argument("--target-epsilon", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fw-dp-ledger-") as tmp:
        db = f"sqlite:///{Path(tmp) / 'history.db'}"
        command = [
            sys.executable, "-m", "fedweave.cli", "simulate", "--task", args.task,
            "--clients", str(args.clients), "--rounds", str(args.rounds), "--dp", "central",
            "--noise-multiplier", str(args.noise_multiplier),
            "--clipping-norm", str(args.clipping_norm), "--dp-delta", str(args.dp_delta),
            "--seed", str(args.seed), "--db", db, "--out", str(Path(tmp) / "report.json"),
            *(["--target-epsilon", str(args.target_epsilon)] if args.target_epsilon else []),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        report = json.loads((Path(tmp) / "report.json").read_text())
        with open_store(db) as store:
            run = store.list_runs()[0]
            rounds = store.rounds(run.run_id)
    privacy = run.config["settings"]["privacy"]
    multiplier, delta = float(privacy["noise_multiplier"]), float(privacy["dp_delta"])
    cohort = args.clients
    print(
        f"{args.task}, {args.clients} sites, {args.rounds} rounds, central DP: stored noise "
        f"multiplier {multiplier:g}, clipping norm {privacy['clipping_norm']:g}, delta {delta:g}"
        + (f" (sized for --target-epsilon {args.target_epsilon:g})" if args.target_epsilon else "")
    )
    accountant = dp_accounting.rdp.RdpAccountant()
    composed, worst = 0, 0.0
    print(f"{'round':>5} {'replied':>7} {'ledger eps':>11} {'recomputed':>11} {'diff':>9}")
    for row in rounds:
        failed = (row.get("extra") or {}).get("failed")
        if not failed and row["replied"] > 0:
            accountant.compose(
                dp_accounting.GaussianDpEvent(multiplier * row["replied"] / cohort)
            )
            composed += 1
        recomputed = accountant.get_epsilon(delta) if composed else 0.0
        ledger = row["extra"]["privacy"]["epsilon"]
        worst = max(worst, abs(ledger - recomputed))
        print(
            f"{row['round']:>5} {row['replied']:>7} {ledger:>11.6f} {recomputed:>11.6f} "
            f"{ledger - recomputed:>9.2e}"
        )
    print(f"largest difference {worst:.2e}; final accuracy {report['final_accuracy']}")
    return 0 if worst < 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
