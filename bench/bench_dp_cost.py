"""What the corrected DP mechanisms cost in accuracy (issue 71): central DP's fixed
denominator and local DP's sensitivity 2C, at a target epsilon, against the tree before.

    python bench/bench_dp_cost.py --rounds 20 --epsilons 3,8
    PYTHONPATH=OLD_TREE_LINKS python bench/bench_dp_cost.py ...   # the tree before

Each row is one real ``fedweave simulate`` (SecAgg+ on, the default) of a task on
``--clients`` sites (Dirichlet 0.5 split, seed 0; breast-cancer: its three hospital files),
with ``--dp central`` or ``--dp local`` and ``--target-epsilon E`` over ``--rounds``: the
noise the ledger sizes for E. Prints the noise it
chose and the final central accuracy. The tree before #71 is run the same way by pointing
``PYTHONPATH`` at a folder whose ``fedweave`` is that tree's (its ``client``,
``coordinator``, ``gossip`` and ``simulations`` linked in as the install maps them); under it
the same E meant half the sensitivity the relation needs (docs/privacy.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def _sites(task: str, clients: int, tmp: Path) -> list[str]:
    """How the run's sites get their data: breast-cancer's three hospital files (the task
    ships no split of its own), any other task split in ``clients`` (Dirichlet 0.5)."""
    if task != "breast-cancer":
        return ["--clients", str(clients), "--partition", "dirichlet", "--alpha", "0.5"]
    from fedweave.learning.tasks.breast_cancer import write_hospital_files

    _, test = write_hospital_files(tmp / "sites")
    return ["--data-dir", str(tmp / "sites"), "--test-data", str(test)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="digits,breast-cancer")
    parser.add_argument("--modes", default="central,local")
    parser.add_argument("--epsilons", default="3,8")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"{'task':>14} {'dp':>8} {'target eps':>10} {'noise':>22} {'final accuracy':>15}")
    for task in args.tasks.split(","):
        for mode in args.modes.split(","):
            for epsilon in args.epsilons.split(","):
                with tempfile.TemporaryDirectory(prefix="fw-dp-cost-") as tmp:
                    out = Path(tmp) / "report.json"
                    command = [
                        sys.executable, "-m", "fedweave.cli", "simulate", "--task", task,
                        *_sites(task, args.clients, Path(tmp)), "--rounds", str(args.rounds),
                        "--seed", "0",
                        "--dp", mode, "--target-epsilon", epsilon, "--evaluate-every", "0",
                        "--db", f"sqlite:///{Path(tmp) / 'h.db'}", "--out", str(out),
                        "--checkpoint-dir", str(Path(tmp) / "ck"),
                    ]  # fmt: skip
                    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
                    if done.returncode != 0:
                        print(done.stderr[-2000:], file=sys.stderr)
                        return 1
                    report = json.loads(out.read_text())
                privacy = report["config"]["privacy"]
                noise = (
                    f"multiplier {privacy['noise_multiplier']:g}" if mode == "central"
                    else f"epsilon/round {privacy['dp_epsilon']:.4g}"
                )  # fmt: skip
                print(
                    f"{task:>14} {mode:>8} {epsilon:>10} {noise:>22} "
                    f"{report['final_accuracy']:>15.4f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
