"""Deployed seconds per round: ``fedweave coordinator`` and 3 ``fedweave client`` sites on
loopback, exactly as docs/deploy.md sets them up (TLS, registered site keys, digits split
with ``fedweave data split``), plain and with SecAgg+.

Each row is the median of a run's rounds 2..R (round 1 also pays for the sites' first
ClientApp start-up), from the seconds the coordinator records per round. ``--stock-flower``
runs every process with ``FEDWEAVE_STOCK_FLOWER=1``: Flower's stock polls, sleeps, backoffs
and per-message ``flwr-clientapp`` processes (fedweave.flower_patches skips its deployment
patches and the sites their long-lived ClientApp worker), which is what fedweave deployed
before them; compare the two on the same machine.

    python bench/bench_deployment.py [--rounds 5] [--sites 3] [--stock-flower]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedweave.addresses import free_port
from fedweave.processes import stop_process_group, tied_to_us


def fedweave(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedweave.cli", *args]


def prepare(work: Path, sites: int, env: dict[str, str]) -> None:
    """Certificates, registered site keys and a split, with the commands a user runs."""
    steps = [
        ("certs", "init", "--out", "tls", "--host", "localhost"),
        ("data", "split", "--task", "digits", "--clients", str(sites), "--partition", "iid",
         "--seed", "0", "--out", "split"),
    ]  # fmt: skip
    for i in range(sites):
        steps += [
            ("sites", "new-key", "--out", f"site{i}.key"),
            ("sites", "add-key", "tls", f"site{i}.pub"),
        ]
    for step in steps:
        subprocess.run(fedweave(*step), cwd=work, env=env, check=True, capture_output=True)


def one_run(work: Path, sites: int, rounds: int, secure: bool, env: dict[str, str]) -> list[float]:
    """Seconds of each recorded round of one deployed run."""
    from fedweave.history import open_store

    port, db = free_port(), f"sqlite:///{work / ('secure.db' if secure else 'plain.db')}"
    coordinator = [
        "coordinator", "--address", f"127.0.0.1:{port}", "--task", "digits",
        "--rounds", str(rounds), "--min-clients", str(sites), "--db", db, "--tls-dir", "tls",
        "--require-registered-sites", "--test-data", "split/test.npz", "--once",
        "--state-dir", f"state-{port}", *([] if secure else ["--no-secure-agg"]),
    ]  # fmt: skip
    procs = []
    try:
        with (work / f"coordinator-{port}.log").open("wb") as log:
            procs.append(subprocess.Popen(
                fedweave(*coordinator), cwd=work, env=env, stdout=log, stderr=log,
                **tied_to_us(),
            ))  # fmt: skip
        for i in range(sites):
            site = [
                "client", "--coordinator", f"127.0.0.1:{port}", "--task", "digits",
                "--data", f"split/site-{i}.npz", "--ca-cert", "tls/ca.pem",
                "--site-key", f"site{i}.key", "--log-file", f"site{i}-{port}.log",
            ]  # fmt: skip
            with (work / f"site{i}-{port}.out").open("wb") as log:
                procs.append(subprocess.Popen(
                    fedweave(*site), cwd=work, env=env, stdout=log, stderr=log,
                    **tied_to_us(),
                ))  # fmt: skip
        code = procs[0].wait(timeout=60 + rounds * 240)
        if code != 0:
            raise SystemExit(f"the coordinator failed (exit {code}); see {work}")
    finally:
        for proc in procs:
            stop_process_group(proc, grace=10)
    with open_store(db) as store:
        run = store.list_runs()[0]
        return [float(r["extra"]["seconds"]) for r in store.rounds(run.run_id)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per run (default 5)")
    parser.add_argument("--sites", type=int, default=3, help="sites (default 3)")
    parser.add_argument(
        "--stock-flower", action="store_true",
        help="Flower's stock polls, sleeps and per-message ClientApp processes",
    )
    args = parser.parse_args()
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    if args.stock_flower:
        env["FEDWEAVE_STOCK_FLOWER"] = "1"
    with tempfile.TemporaryDirectory(prefix="fedweave-bench-deploy-") as tmp:
        work = Path(tmp)
        prepare(work, args.sites, env)
        rows = {}
        for secure in (False, True):
            started = time.perf_counter()
            seconds = one_run(work, args.sites, args.rounds, secure, env)
            rows["SecAgg+" if secure else "plain"] = (seconds, time.perf_counter() - started)
    flower = "Flower's stock behaviour" if args.stock_flower else "fedweave's worker and patches"
    print(f"fedweave deployment, {args.sites} sites, digits, loopback, TLS + site keys, {flower}")
    print(f"{'mode':<10}{'median s (rounds 2..)':>24}{'round 1 s':>12}{'wall s':>9}  per round")
    for name, (seconds, wall) in rows.items():
        steady = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
        per = " ".join(f"{s:.1f}" for s in seconds)
        print(f"{name:<10}{steady:>24.2f}{seconds[0]:>12.1f}{wall:>9.0f}  {per}")


if __name__ == "__main__":
    main()
