"""Final accuracy under sample-level DP (``--dp sample``, DP-SGD at every site) at several
epsilons, against the same run without DP (issue 33).

    python bench/bench_sample_dp.py --task digits --clients 5 --rounds 10
    python bench/bench_sample_dp.py --task breast-cancer --hospitals --rounds 10
    python bench/bench_sample_dp.py --task breast-cancer --hospitals --rounds 10 --deployed

``--deployed`` (with ``--hospitals``) runs each as a deployment on loopback instead, set up
as docs/deploy.md does it: ``fedweave certs init``, a registered key a site, ``fedweave
coordinator`` (TLS, SecAgg+, the test file centrally) and one ``fedweave client`` per
hospital file, each with its own ``--privacy-ledger`` file, fresh for every run.

Every run is a real ``fedweave simulate`` (SecAgg+ on, the default; every site trains for
real) with the same seed and training flags. First the run without DP, whose history gives
each site's example count; then, for each target epsilon, the noise multiplier that makes the
smallest site (the one that spends most: its batches are the largest share of its data)
spend that epsilon at ``--dp-delta`` over all the run's DP-SGD steps (Opacus's own
``get_noise_multiplier``, RDP), and the run with it. Prints per run: the noise multiplier,
the run's epsilon as the sites reported it (the most any site spent, its own ledger), and the
final central test accuracy.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from opacus.accountants.utils import get_noise_multiplier

from fedweave.history import open_store


def simulate(args, tmp: Path, name: str, *extra: str) -> tuple[dict, list[dict]]:
    db = f"sqlite:///{tmp / (name + '.db')}"
    data = (
        ["--data-dir", str(tmp / "sites"), "--test-data", str(tmp / "test.csv")]
        if args.hospitals
        else ["--clients", str(args.clients)]
    )
    command = [
        sys.executable, "-m", "fedweave.cli", "simulate", "--task", args.task, *data,
        "--rounds", str(args.rounds), "--seed", str(args.seed), "--optimizer", args.optimizer,
        "--lr", str(args.lr), "--local-epochs", str(args.local_epochs),
        "--batch-size", str(args.batch_size), "--checkpoint-dir", str(tmp / name),
        "--db", db, "--out", str(tmp / f"{name}.json"), *extra,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    with open_store(db) as store:
        run = store.list_runs()[0]
        sites = store.site_results(run.run_id, 1)
    return json.loads((tmp / f"{name}.json").read_text()), sites


def deployed(args, tmp: Path, name: str, *extra: str) -> tuple[dict, list[dict]]:
    """One deployed run of the hospital files (see the module's docstring): what
    ``fedweave simulate``'s report would say (final accuracy, privacy) and round 1's sites."""
    import os

    from fedweave.addresses import free_port
    from fedweave.processes import stop_process_group, tied_to_us

    cli = [sys.executable, "-m", "fedweave.cli"]
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    files = sorted((tmp / "sites").glob("*.csv"))
    if not (tmp / "tls").exists():
        steps = [["certs", "init", "--out", "tls", "--host", "localhost"]]
        for i in range(len(files)):
            steps += [["sites", "new-key", "--out", f"site{i}.key"],
                      ["sites", "add-key", "tls", f"site{i}.pub"]]  # fmt: skip
        for step in steps:
            subprocess.run([*cli, *step], cwd=tmp, env=env, check=True, capture_output=True)
    port, db = free_port(), f"sqlite:///{tmp / (name + '.db')}"
    coordinator = [
        "coordinator", "--address", f"127.0.0.1:{port}", "--task", args.task,
        "--rounds", str(args.rounds), "--min-clients", str(len(files)), "--db", db,
        "--tls-dir", "tls", "--test-data", "test.csv", "--once", "--state-dir", f"state-{name}",
        "--seed", str(args.seed), "--optimizer", args.optimizer, "--lr", str(args.lr),
        "--local-epochs", str(args.local_epochs), "--batch-size", str(args.batch_size), *extra,
    ]  # fmt: skip
    procs = []
    try:
        with (tmp / f"coordinator-{name}.log").open("wb") as log:
            procs.append(subprocess.Popen([*cli, *coordinator], cwd=tmp, env=env, stdout=log,
                                          stderr=log, **tied_to_us()))  # fmt: skip
        for i, path in enumerate(files):
            site = [
                "client", "--coordinator", f"127.0.0.1:{port}", "--task", args.task,
                "--data", str(path), "--ca-cert", "tls/ca.pem", "--site-key", f"site{i}.key",
                "--privacy-ledger", f"ledger-{name}-{i}.json", "--log-file", f"site{i}-{name}.log",
            ]  # fmt: skip
            with (tmp / f"site{i}-{name}.out").open("wb") as log:
                procs.append(subprocess.Popen([*cli, *site], cwd=tmp, env=env, stdout=log,
                                              stderr=log, **tied_to_us()))  # fmt: skip
        code = procs[0].wait(timeout=120 + args.rounds * 240)
        if code != 0:
            log_text = (tmp / f"coordinator-{name}.log").read_text()[-3000:]
            raise SystemExit(f"{name}: the coordinator failed (exit {code}):\n{log_text}")
    finally:
        for proc in procs:
            stop_process_group(proc, grace=10)
    with open_store(db) as store:
        run = store.list_runs()[0]
        rows = store.rounds(run.run_id)
        sites = store.site_results(run.run_id, 1)
    privacy = (rows[-1]["extra"] or {}).get("privacy")
    return {"final_accuracy": rows[-1]["eval_accuracy"], "privacy": privacy}, sites


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="digits")
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--hospitals", action="store_true",
                        help="breast-cancer's three hospital files instead of a split")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 8.0])
    parser.add_argument("--dp-delta", type=float, default=1e-5)
    parser.add_argument("--clipping-norm", type=float, default=1.0)
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deployed", action="store_true",
                        help="deployed on loopback (TLS, site keys, SecAgg+); needs --hospitals")
    args = parser.parse_args()
    if args.deployed and not args.hospitals:
        parser.error("--deployed runs the hospital files: add --hospitals")
    run = deployed if args.deployed else simulate

    with tempfile.TemporaryDirectory(prefix="fw-sample-dp-") as name:
        tmp = Path(name)
        if args.hospitals:
            from fedweave.learning.tasks.breast_cancer import write_hospital_files

            write_hospital_files(tmp / "sites")
        plain, sites = run(args, tmp, "no-dp")
        smallest = min(site["num_examples"] for site in sites if site["status"] == "ok")
        batches = max(1, math.ceil(smallest / args.batch_size))
        steps = args.rounds * args.local_epochs * batches
        print(
            f"{args.task}, {len(sites)} sites (smallest {smallest} examples), {args.rounds} "
            f"rounds x {args.local_epochs} epochs, batch {args.batch_size}, SecAgg+ on, "
            f"delta {args.dp_delta:g}, {'deployed on loopback' if args.deployed else 'simulated'}"
        )
        print(f"{'target eps':>10} {'noise z':>8} {'run eps':>8} {'accuracy':>9}")
        print(f"{'no DP':>10} {'-':>8} {'-':>8} {plain['final_accuracy']:>9.4f}")
        for target in args.epsilons:
            multiplier = get_noise_multiplier(
                target_epsilon=target, target_delta=args.dp_delta, sample_rate=1 / batches,
                steps=steps, accountant="rdp",
            )  # fmt: skip
            report, _ = run(
                args, tmp, f"eps-{target:g}", "--dp", "sample",
                "--noise-multiplier", f"{multiplier:.4f}", "--clipping-norm",
                str(args.clipping_norm), "--dp-delta", str(args.dp_delta),
            )  # fmt: skip
            spent, accuracy = report["privacy"]["epsilon"], report["final_accuracy"]
            print(f"{target:>10g} {multiplier:>8.4f} {spent:>8.3f} {accuracy:>9.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
