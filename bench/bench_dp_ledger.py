"""Each DP mode's ledger against an independent recomputation with Google's dp-accounting.

    python bench/bench_dp_ledger.py --dp central --task digits --clients 10 --rounds 10
    python bench/bench_dp_ledger.py --dp local --clients 10 --rounds 10 --dp-epsilon 4
    python bench/bench_dp_ledger.py --dp sample --clients 4 --rounds 10

Runs one real ``fedweave simulate --dp MODE`` (SecAgg+ on, the default) into a temporary
history, then recomputes the epsilon from the run's stored settings alone with
``dp_accounting.rdp.RdpAccountant`` (not fedweave's code, not Flower's or Opacus's), for the
relation and sensitivity the run header states:

- ``central`` (add-or-remove-one site, sensitivity C/m: a fixed denominator): one Gaussian
  release of the stored ``noise_multiplier`` per round that released (``replied`` > 0, not
  failed), whoever replied.
- ``local`` (replace-one, sensitivity 2C): one Gaussian release of multiplier
  ``sqrt(2 ln(1.25 / delta)) / dp_epsilon`` per round in which sites were sampled.
- ``sample`` (add-or-remove-one example): each site's own ledger file (every DP-SGD step's
  noise multiplier and Poisson rate), composed as Poisson-sampled Gaussian events; the run's
  figure is the largest site's.

Prints, per round, the ledger's epsilon, the recomputed one and their difference (sample: per
site, at the end), then the largest difference and the final accuracy. The goal: a difference
of 0 up to float rounding (below 1e-6; Opacus and dp-accounting use different RDP orders, so
sample DP is compared to 2%).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import dp_accounting

from fedweave.history import open_store


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", choices=("central", "local", "sample"), default="central")
    parser.add_argument("--task", default="digits")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--noise-multiplier", type=float, default=0.8)
    parser.add_argument("--clipping-norm", type=float, default=1.0)
    parser.add_argument("--dp-delta", type=float, default=1e-5)
    parser.add_argument("--dp-epsilon", type=float, default=4.0)
    parser.add_argument("--target-epsilon", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fw-dp-ledger-") as tmp:
        db = f"sqlite:///{Path(tmp) / 'history.db'}"
        noise = (
            ["--dp-epsilon", str(args.dp_epsilon)] if args.dp == "local"
            else ["--noise-multiplier", str(args.noise_multiplier)]
        )  # fmt: skip
        command = [
            sys.executable, "-m", "fedweave.cli", "simulate", "--task", args.task,
            "--clients", str(args.clients), "--rounds", str(args.rounds), "--dp", args.dp,
            *([] if args.target_epsilon else noise),
            "--clipping-norm", str(args.clipping_norm), "--dp-delta", str(args.dp_delta),
            "--seed", str(args.seed), "--db", db, "--out", str(Path(tmp) / "report.json"),
            "--checkpoint-dir", str(Path(tmp) / "checkpoints"),
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
        ledgers = {
            path.name.split(".")[0]: json.loads(path.read_text())["history"]
            for path in (Path(tmp) / "checkpoints" / run.run_id / "site-ledgers").glob("*.json")
        }
    privacy = run.config["settings"]["privacy"]
    delta = float(privacy["dp_delta"])
    facts = run.config["protections"]["differential_privacy"]["ledger"]
    print(
        f"{args.task}, {args.clients} sites, {args.rounds} rounds, --dp {args.dp}: stored "
        f"{ {k: v for k, v in privacy.items() if k != 'dp'} }; relation {facts['neighbouring']}, "
        f"sensitivity {facts['sensitivity']}"
    )
    if args.dp == "sample":
        return _sample(rounds, ledgers, delta, report)
    if args.dp == "central":
        multiplier = float(privacy["noise_multiplier"])
    else:
        multiplier = math.sqrt(2 * math.log(1.25 / delta)) / float(privacy["dp_epsilon"])
    accountant = dp_accounting.rdp.RdpAccountant()
    composed, worst = 0, 0.0
    print(f"{'round':>5} {'replied':>7} {'ledger eps':>11} {'recomputed':>11} {'diff':>9}")
    for row in rounds:
        failed = (row.get("extra") or {}).get("failed")
        released = row["replied"] > 0 if args.dp == "central" else row["sampled"] > 0
        if not failed and released:
            accountant.compose(dp_accounting.GaussianDpEvent(multiplier))
            composed += 1
        recomputed = accountant.get_epsilon(delta) if composed else 0.0
        ledger = row["extra"]["privacy"]["epsilon"]
        worst = max(worst, abs(ledger - recomputed))
        print(
            f"{row['round']:>5} {row['replied']:>7} {ledger:>11.6f} {recomputed:>11.6f} "
            f"{ledger - recomputed:>9.2e}"
        )
    print(f"largest difference {worst:.2e}; final accuracy {report['final_accuracy']}")
    return 0 if worst < 1e-6 else 1


def _sample(rounds: list, ledgers: dict, delta: float, report: dict) -> int:
    """Each site's epsilon from its own ledger file, recomputed with dp-accounting, against
    the figure the run's last round recorded for it."""
    recorded = rounds[-1]["extra"]["privacy"]["sites"] if rounds else {}
    print(f"{'site ledger':>14} {'steps':>6} {'recomputed':>11}")
    recomputed = {}
    for name, history in sorted(ledgers.items()):
        accountant = dp_accounting.rdp.RdpAccountant()
        for multiplier, rate, steps in history:
            event = dp_accounting.PoissonSampledDpEvent(
                rate, dp_accounting.GaussianDpEvent(multiplier)
            )
            accountant.compose(event, int(steps))
        recomputed[name] = accountant.get_epsilon(delta)
        steps = sum(int(n) for _, _, n in history)
        print(f"{name:>14} {steps:>6} {recomputed[name]:>11.4f}")
    run_figure = rounds[-1]["extra"]["privacy"]["epsilon"] if rounds else 0.0
    largest = max(recomputed.values(), default=0.0)
    gap = abs(run_figure - largest) / max(largest, 1e-12)
    print(
        f"run's epsilon {run_figure:.4f} (sites recorded: {recorded}); largest recomputed "
        f"{largest:.4f}; relative difference {gap:.2%}; final accuracy {report['final_accuracy']}"
    )
    return 0 if gap < 0.02 else 1


if __name__ == "__main__":
    sys.exit(main())
