"""Two DP runs with the same flags and seed differ by noise of the stated size (issue 71).

    python bench/bench_dp_noise.py [--clients 4] [--mode central|sample|local]

Runs ``fedweave simulate --dp MODE --rounds 1 --seed 0`` twice (SecAgg+ on, the default) into
two histories and compares their round-1 checkpoints. Without DP the two would be identical
(a seeded run repeats: ``--mode none`` shows it). Under central DP the sites train alike and
only the coordinator's noise differs, so each weight's difference is N(0, 2 (z C / m)^2): the
script prints the difference's standard deviation against ``sqrt(2) z C / m``. Under local and
sample DP the noise enters at the sites (sample DP: inside training), so the figure printed
is the difference's size, which must not be 0.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def _round_one(tmp: Path, name: str, mode: str, clients: int) -> list[np.ndarray]:
    dp = {"none": [], "central": ["--dp", "central", "--noise-multiplier", "1.0"],
          "sample": ["--dp", "sample", "--noise-multiplier", "1.0"],
          "local": ["--dp", "local", "--dp-epsilon", "10"]}[mode]  # fmt: skip
    checkpoints = tmp / f"{name}-ck"
    command = [
        sys.executable, "-m", "fedweave.cli", "simulate", "--task", "digits", "--clients",
        str(clients), "--rounds", "1", "--seed", "0", "--partition", "iid",
        "--evaluate-every", "0", *dp, "--db", f"sqlite:///{tmp / (name + '.db')}",
        "--out", str(tmp / f"{name}.json"), "--checkpoint-dir", str(checkpoints),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    (checkpoint,) = checkpoints.glob("*/round-00001.npz")
    with np.load(checkpoint) as saved:
        return [saved[key] for key in sorted(saved.files)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--mode", choices=("none", "central", "sample", "local"),
                        default="central")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fw-dp-noise-") as tmp:
        first = _round_one(Path(tmp), "first", args.mode, args.clients)
        second = _round_one(Path(tmp), "second", args.mode, args.clients)
    difference = np.concatenate(
        [(a.astype(np.float64) - b).ravel() for a, b in zip(first, second)
         if np.issubdtype(a.dtype, np.floating)]
    )  # fmt: skip
    line = (
        f"--dp {args.mode}, digits, {args.clients} sites, seed 0, two runs: "
        f"{int(np.count_nonzero(difference))} of {difference.size} weights differ; "
        f"difference std {difference.std():.5f}, mean {difference.mean():+.5f}"
    )
    if args.mode == "central":
        stated = math.sqrt(2) * 1.0 * 1.0 / args.clients
        line += f"; stated sqrt(2) z C / m = {stated:.5f} (ratio {difference.std() / stated:.3f})"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
