"""FedBuff against two insiders, and what its bounds cost an honest run (issue 39).

Five digits sites (iid split, ``--seed``), ``fedweave simulate --schedule async --buffer 2
--no-secure-agg``, in arrival order, ``--steps`` steps. With ``--insiders``, one site
(``tests/fault_tasks.py``'s ``MarkedDigits``, its install rewritten) sends NaN weights after
its own update check and another sends zero weights claiming 10**12 examples. Prints, for
each seed, the final central accuracy and the mean of the last five steps; the honest rows
are the run's cost of the bounds when compared with the same command on an earlier commit.

    python bench/bench_fedbuff_insiders.py [--seeds 0 1 2] [--steps 30] [--insiders]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def run(seed: int, steps: int, insiders: bool) -> list[float]:
    """The central accuracy after each step of one run."""
    from fault_tasks import NAN_SENDING_MARK, ZEROS_CLAIMING_MARK
    from insider_runs import run_with_insiders

    marks = {3: NAN_SENDING_MARK, 4: ZEROS_CLAIMING_MARK} if insiders else {}
    with tempfile.TemporaryDirectory() as folder:
        rounds, _sites = run_with_insiders(
            Path(folder), marks,
            ["--rounds", str(steps), "--no-secure-agg", "--schedule", "async", "--buffer", "2"],
            seed,
        )  # fmt: skip
    return [float(r["eval_accuracy"]) for r in rounds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--insiders", action="store_true", help="one NaN site, one zeros site")
    args = parser.parse_args()
    print(f"{'insiders' if args.insiders else 'honest'}, {args.steps} steps")
    for seed in args.seeds:
        accuracy = run(seed, args.steps, args.insiders)
        print(f"seed {seed}: final {accuracy[-1]:.3f}  last five {sum(accuracy[-5:]) / 5:.3f}")


if __name__ == "__main__":
    main()
