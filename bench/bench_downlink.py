"""What sending the global model at half precision costs in accuracy, and saves in bytes
(issue 36: ``--downlink fp16``), federated, against ``--downlink full``.

    python bench/bench_downlink.py --task digits --clients 10 --rounds 20 --seeds 0 1 2
    python bench/bench_downlink.py --task mnist5k --no-secure-agg

Each run is a real ``fedweave simulate`` (the simulation engine; every site trains for real)
with the same seed both ways; SecAgg+ on unless ``--no-secure-agg``. The bytes are what the
coordinator's grid counted (``coordinator/rounds/traffic.py``): a round's bytes out are the
model to each site to train and, every round here, to evaluate. Prints per seed and as the
mean: bytes out a round and their ratio to ``full``, the final central test accuracy and the
difference in points. The issue asks for a half-size transfer "where it loses nothing
measurable": the difference should sit inside the seeds' own spread.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KINDS = ("full", "fp16")


def run(kind: str, seed: int, args: argparse.Namespace, work: Path) -> dict:
    """One recorded simulation: mean bytes out a round and the final central accuracy."""
    from fedweave.history import open_store

    db = work / f"{kind}-{seed}.db"
    command = [
        sys.executable, "-m", "fedweave.cli", "simulate", "--task", args.task,
        "--clients", str(args.clients), "--rounds", str(args.rounds), "--seed", str(seed),
        "--partition", args.partition, "--downlink", kind, "--db", f"sqlite:///{db}",
        "--checkpoint-dir", str(work / "ck"),
        *([] if args.secure_agg else ["--no-secure-agg"]),
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=work)
    if done.returncode != 0:
        raise SystemExit(f"{kind} seed {seed} failed: {done.stderr[-2000:]}")
    with open_store(f"sqlite:///{db}") as store:
        rows = store.rounds(store.list_runs()[0].run_id)
    return {
        "bytes_out": statistics.mean(row["bytes_out"] for row in rows),
        "accuracy": float(rows[-1]["eval_accuracy"]),
        "seconds": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="digits")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--partition", default="dirichlet")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--no-secure-agg", dest="secure_agg", action="store_false")
    args = parser.parse_args()
    print(f"{args.task}, {args.clients} sites, {args.rounds} rounds, {args.partition}, "
          f"SecAgg+ {'on' if args.secure_agg else 'off'}", flush=True)  # fmt: skip
    results: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="fedweave-bench-downlink-") as tmp:
        for seed in args.seeds:
            for kind in KINDS:
                found = run(kind, seed, args, Path(tmp))
                results[kind].append(found)
                print(f"seed {seed} {kind:4s}: accuracy {found['accuracy']:.4f}, "
                      f"{found['bytes_out']:,.0f} B out a round ({found['seconds']:.0f} s)",
                      flush=True)  # fmt: skip
    full, half = results["full"], results["fp16"]
    ratio = statistics.mean(h["bytes_out"] / f["bytes_out"] for f, h in zip(full, half))
    points = [100 * (h["accuracy"] - f["accuracy"]) for f, h in zip(full, half)]
    spread = [f["accuracy"] for f in full]
    print(f"full: accuracy {statistics.mean(spread):.4f} (seeds {min(spread):.4f}-"
          f"{max(spread):.4f}); fp16: {statistics.mean(h['accuracy'] for h in half):.4f}; "
          f"difference {statistics.mean(points):+.2f} points (per seed "
          f"{', '.join(f'{p:+.2f}' for p in points)}); bytes out {ratio:.3f}x")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
