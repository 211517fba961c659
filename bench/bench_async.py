"""Simulated time to a target accuracy at sites of unequal speed (issue 24): buffered
asynchronous aggregation (FedBuff) against synchronous FedAvg with a deadline and FedProx
with the same deadline, on the same sites (``--site-speeds``, a heavy-tailed spread fixed by
the seed), several seeds.

    python bench/bench_async.py --task synthetic-1-1 --clients 30 --seeds 0 1 2
    python bench/bench_async.py --task mnist5k --clients 30 --seeds 0 1 2 --target 0.85
    python bench/bench_async.py ... --secure   # every method under SecAgg+

Prints, per seed and method, the simulated seconds until the central test accuracy first
reached ``--target`` and the final accuracy, then the ratio the issue states its goal in:
FedBuff's time to the target over synchronous FedAvg's (goal <= 0.5 at equal final accuracy,
within 1 point). Each run is a real `fedweave simulate` (the simulation engine, every site
training for real); only the clock is simulated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

METHODS = ("fedbuff", "fedavg", "fedavg-wait", "fedprox")
"""fedavg and fedprox close rounds at --deadline; fedavg-wait waits for every site."""


def run(method: str, args: argparse.Namespace, seed: int, work: Path) -> dict:
    """One recorded simulation; the rounds' accuracy and simulated clock."""
    db = work / f"{method}-{seed}.db"
    common = [
        "--task", args.task, "--clients", str(args.clients), "--partition", args.partition,
        "--seed", str(seed), "--site-speeds", args.speeds,
        *([] if args.secure else ["--no-secure-agg"]),
        "--local-epochs", str(args.local_epochs), "--evaluate-every", "0",
        "--eval-fraction", "0", "--db", f"sqlite:///{db}", "--out", str(work / "r.json"),
        "--checkpoint-dir", str(work / "ck"),
    ]  # fmt: skip
    if method == "fedbuff":
        extra = ["--schedule", "async", "--buffer", str(args.buffer), "--max-staleness",
                 str(args.max_staleness), "--server-lr", str(args.server_lr),
                 "--rounds", str(args.async_rounds)]  # fmt: skip
    elif method == "fedavg-wait":
        extra = ["--strategy", "fedavg", "--rounds", str(args.sync_rounds)]
    else:
        extra = ["--strategy", method, "--simulated-deadline", str(args.deadline),
                 "--rounds", str(args.sync_rounds)]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", "simulate", *common, *extra],
        capture_output=True, text=True, cwd=work,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{method} seed {seed} failed: {done.stderr[-2000:]}")
    from fedweave.history import open_store

    with open_store(f"sqlite:///{db}") as store:
        run_id = store.list_runs()[0].run_id
        rows = store.rounds(run_id)
    curve = [(r["extra"]["simulated_clock"], r["eval_accuracy"]) for r in rows]
    reached = next((clock for clock, accuracy in curve if accuracy >= args.target), None)
    return {"reached_s": reached, "final": curve[-1][1], "clock_end": curve[-1][0],
            "rounds": len(curve), "wall_s": time.perf_counter() - started, "curve": curve}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="synthetic-1-1")
    parser.add_argument("--partition", default="auto")
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--speeds", default="pareto:1.5", help="--site-speeds of every run")
    parser.add_argument("--target", type=float, default=0.7)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--buffer", type=int, default=10)
    parser.add_argument("--max-staleness", type=int, default=20)
    parser.add_argument("--server-lr", type=float, default=1.0, help="FedBuff's --server-lr")
    parser.add_argument("--deadline", type=float, default=2.0,
                        help="synchronous runs' --simulated-deadline (s)")  # fmt: skip
    parser.add_argument("--sync-rounds", type=int, default=30)
    parser.add_argument("--async-rounds", type=int, default=90)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                        help="run only these (the ratios need fedbuff and the other one)")
    parser.add_argument("--secure", action="store_true",
                        help="every method under SecAgg+ (FedBuff: secure buffers, "
                             "docs/schedules.md); default: all with --no-secure-agg")  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write every result here")
    args = parser.parse_args()
    results: dict[str, dict[int, dict]] = {m: {} for m in METHODS}
    with tempfile.TemporaryDirectory(prefix="fedweave-bench-async-") as tmp:
        for seed in args.seeds:
            for method in args.methods:
                found = run(method, args, seed, Path(tmp))
                results[method][seed] = found
                reached = found["reached_s"]
                print(
                    ("secure " if args.secure else "")
                    + f"{args.task} seed {seed} {method:11s}: target {args.target:g} at "
                    + (f"{reached:8.1f} s" if reached is not None else "   never  ")
                    + f" simulated; final accuracy {found['final']:.4f} after "
                    f"{found['rounds']} steps, {found['clock_end']:.1f} s simulated "
                    f"({found['wall_s']:.0f} s of wall clock)",
                    flush=True,
                )
    for method in ("fedavg", "fedavg-wait", "fedprox"):
        if "fedbuff" not in args.methods or method not in args.methods:
            continue
        ratios = [
            results["fedbuff"][s]["reached_s"] / results[method][s]["reached_s"]
            for s in args.seeds
            if results["fedbuff"][s]["reached_s"] and results[method][s]["reached_s"]
        ]
        gaps = [results["fedbuff"][s]["final"] - results[method][s]["final"] for s in args.seeds]
        print(
            f"FedBuff / {method} simulated time to {args.target:g}: "
            + (f"median {statistics.median(ratios):.3f} over {len(ratios)} seeds "
               f"({', '.join(f'{r:.3f}' for r in ratios)})" if ratios else "not comparable")
            + f"; final accuracy FedBuff minus {method}: "
            + ", ".join(f"{100 * g:+.1f}" for g in gaps) + " points"
            + (" (goal: <= 0.5 at +-1 point)" if method == "fedavg" else "")
        )  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
