"""How a federated simulation grows with the number of sites: seconds per round and the peak
memory of the whole process tree (the driver plus every Ray worker), plain and with SecAgg+.

For each total number of sites N, samples N/10 a round (--fraction) on synthetic-1-1 and runs
`fedweave simulate` as a child process; memory is the sum over the tree of each process's
proportional set size (PSS, /proc/PID/smaps_rollup: shared pages split among the processes
that map them, so libraries and Ray's shared object store count once), sampled every 0.25 s.
Seconds per round: the median of rounds 2 and later (round 1 pays Ray's start-up).

    python bench/bench_scale.py --sites 10,100,1000,5000 --rounds 4
    python bench/bench_scale.py --sites 100,1000,5000 --per-round 100 --modes plain
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def tree_pss_bytes(root: int) -> int:
    """Sum of PSS over ``root`` and all its descendants (0 for processes gone meanwhile)."""
    tree, total, queue = _children(), 0, [root]
    while queue:
        pid = queue.pop()
        queue.extend(tree.get(pid, []))
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            pass
    return total


def run_once(sites: int, per_round: int, rounds: int, secure: bool, work: Path) -> dict:
    out = work / f"report-{sites}-{int(secure)}.json"
    cmd = [
        sys.executable, "-m", "fedweave.cli", "simulate", "--task", "synthetic-1-1",
        "--clients", str(sites), "--clients-per-round", str(per_round), "--rounds", str(rounds),
        "--lr", "0.01", "--out", str(out), "--db", f"sqlite:///{work / 'history.db'}",
        "--secure-agg" if secure else "--no-secure-agg",
    ]  # fmt: skip
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_pss_bytes(proc.pid))
        time.sleep(0.25)
    output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[-3000:]}")
    report = json.loads(out.read_text())
    seconds = [row["seconds"] for row in report["rounds"][1:]] or [report["rounds"][0]["seconds"]]
    return {
        "sites": sites, "per_round": per_round, "secure": secure,
        "s_per_round": statistics.median(seconds), "peak_gb": peak / 1e9,
        "wall_s": time.perf_counter() - started,
        "final_accuracy": report["final_accuracy"],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", default="10,100,1000,5000")
    parser.add_argument("--fraction", type=float, default=0.1, help="sampled a round")
    parser.add_argument(
        "--per-round", type=int, default=None,
        help="sites sampled a round whatever the total (instead of --fraction): shows how "
        "round time grows with the total number of sites alone",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--modes", default="plain,secagg", help="plain and/or secagg")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",")]
    print(f"{'sites':>6} {'a round':>8} {'mode':>7} {'s/round':>8} {'peak GB':>8} {'wall s':>7}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedweave-scale-") as tmp:
        for sites in (int(s) for s in args.sites.split(",")):
            per_round = args.per_round or max(1, round(args.fraction * sites))
            for mode in modes:
                if mode == "secagg" and per_round < 3:
                    print(f"{sites:>6} {per_round:>8} {mode:>7}  (SecAgg+ needs 3+ a round)")
                    continue
                row = run_once(sites, per_round, args.rounds, mode == "secagg", Path(tmp))
                rows.append(row)
                print(
                    f"{sites:>6} {per_round:>8} {mode:>7} {row['s_per_round']:>8.2f} "
                    f"{row['peak_gb']:>8.2f} {row['wall_s']:>7.0f}",
                    flush=True,
                )
    by = {(r["sites"], r["secure"]): r for r in rows}
    for sites in sorted({r["sites"] for r in rows}):
        if (sites, True) in by and (sites, False) in by:
            ratio = by[(sites, True)]["s_per_round"] / by[(sites, False)]["s_per_round"]
            print(f"SecAgg+ / plain seconds per round at {sites} sites: {ratio:.1f}x")


if __name__ == "__main__":
    main()
