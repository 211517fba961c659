"""The diabetes consortium of issue 34, deployed as a user runs it from the docs.

Four clinics (scikit-learn's diabetes table unscaled, 40/80/120/150 rows; one file with its
columns reversed, one with an extra ``patient_id``, one that spells ``bmi`` as ``BMI`` and
maps it with ``fedweave client --columns map.toml``) and a coordinator with no data. The task
is a package (the README's template: ``clinic-task/pyproject.toml`` and ``clinic_task.py``),
``pip install``-ed separately for the coordinator and for each site (each process sees only
its own install); ``--task diabetes`` everywhere. TLS, registered site keys, SecAgg+, the
task's own training defaults. After each run: ``history export``, ``fedweave predict`` on the
held-out 52 rows (RMSE, MAE), and ``fedweave.load_model`` on the raw CSV checked against it.
The reference is the same model trained centrally on the pooled clinics' rows
(``bench_regression.central``), for as many epochs as the federation has rounds.

    python bench/bench_diabetes_consortium.py [--rounds 20] [--seeds 0 1 2] [--keep DIR]

``--keep DIR`` leaves the last seed's consoles, export, ``history show`` and the default
``history plot`` (``plot.png``) there.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dp_tables import DIABETES_TASK, write_diabetes  # noqa: E402
from bench_regression import central  # noqa: E402

CLI = [sys.executable, "-m", "fedweave.cli"]
PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "clinic-task"
version = "1.2.0"
dependencies = ["fedweave"]

[project.entry-points."fedweave.tasks"]
diabetes = "clinic_task:task"

[tool.setuptools]
py-modules = ["clinic_task"]
"""


def clinics(root: Path) -> list[Path]:
    """The four clinic files as the issue describes them, and the BMI clinic's column map."""
    sites = sorted((root / "sites").glob("*.csv"))
    frame = pd.read_csv(sites[1])
    frame[list(reversed(frame.columns))].to_csv(sites[1], index=False)
    frame = pd.read_csv(sites[2])
    frame.insert(0, "patient_id", [f"P{i:04d}" for i in range(len(frame))])
    frame.to_csv(sites[2], index=False)
    frame = pd.read_csv(sites[3])
    frame.rename(columns={"bmi": "BMI"}).to_csv(sites[3], index=False)
    (root / "map.toml").write_text('[columns]\nBMI = "bmi"\n')
    return sites


def install_task_package(root: Path, names: list[str]) -> dict[str, Path]:
    """``pip install ./clinic-task`` once per machine-to-be: a target folder each."""
    package = root / "clinic-task"
    package.mkdir()
    (package / "pyproject.toml").write_text(PYPROJECT)
    (package / "clinic_task.py").write_text(DIABETES_TASK)
    installs = {}
    for name in names:
        target = root / "installs" / name
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
             "--no-build-isolation", "--target", str(target), str(package)],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        installs[name] = target
    return installs


def run_fedweave(root: Path, install: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(install), "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1"}  # fmt: skip
    return subprocess.run([*CLI, *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600, **kwargs)  # fmt: skip


def deployed(root: Path, installs: dict[str, Path], sites: list[Path], rounds: int, seed: int):
    """One deployed run; returns (run id, history db URL)."""
    from fedweave.addresses import free_port
    from fedweave.processes import stop_process_group, tied_to_us

    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    port, db = free_port(), f"sqlite:///{root / f'history-{seed}.db'}"
    coordinator = [
        "coordinator", "--address", f"127.0.0.1:{port}", "--task", "diabetes",
        "--rounds", str(rounds), "--min-clients", str(len(sites)), "--db", db,
        "--tls-dir", "tls", "--once", "--state-dir", f"state-{seed}", "--seed", str(seed),
    ]  # fmt: skip
    procs = []
    try:
        with (root / f"coordinator-{seed}.out").open("wb") as log:
            procs.append(subprocess.Popen(
                [*CLI, *coordinator], cwd=root, stdout=log, stderr=log,
                env={**env, "PYTHONPATH": str(installs["coordinator"])}, **tied_to_us(),
            ))  # fmt: skip
        for i, path in enumerate(sites):
            site = [
                "client", "--coordinator", f"127.0.0.1:{port}", "--task", "diabetes",
                "--data", str(path), "--ca-cert", "tls/ca.pem", "--site-key", f"site{i}.key",
                "--name", path.stem, "--log-file", f"site{i}-{seed}.log",
            ]  # fmt: skip
            if i == 3:
                site += ["--columns", "map.toml"]
            with (root / f"site{i}-{seed}.out").open("wb") as log:
                procs.append(subprocess.Popen(
                    [*CLI, *site], cwd=root, stdout=log, stderr=log,
                    env={**env, "PYTHONPATH": str(installs[f"site{i}"])}, **tied_to_us(),
                ))  # fmt: skip
        code = procs[0].wait(timeout=120 + rounds * 60)
        if code != 0:
            text = (root / f"coordinator-{seed}.out").read_text()[-3000:]
            raise SystemExit(f"seed {seed}: the coordinator failed (exit {code}):\n{text}")
    finally:
        for proc in procs:
            stop_process_group(proc, grace=10)
    from fedweave.history import open_store

    with open_store(db) as store:
        return store.list_runs()[0].run_id, db


def scored(root: Path, install: Path, run_id: str, db: str, seed: int) -> dict[str, float]:
    """Export the run, predict the held-out file, check ``load_model`` against predict."""
    out = root / f"export-{seed}"
    for args in (
        ("history", "export", run_id, "--db", db, "--to", str(out)),
        ("predict", "--run", run_id, "--db", db, "--data", "test.csv",
         "--out", f"predictions-{seed}.csv"),
    ):  # fmt: skip
        done = run_fedweave(root, install, *args)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(args[:2])} failed:\n{done.stderr[-2000:]}")
    predicted = pd.read_csv(root / f"predictions-{seed}.csv")["prediction"].to_numpy()
    truth = pd.read_csv(root / "test.csv")["progression"].to_numpy()
    errors = predicted - truth
    import fedweave

    with open(root / "test.csv", newline="") as handle:
        rows = fedweave.load_model(out).predict(csv.DictReader(handle))
    gap = float(np.max(np.abs(np.array([r["prediction"] for r in rows]) - predicted)))
    return {"rmse": float(np.sqrt(np.mean(errors**2))), "mae": float(np.mean(np.abs(errors))),
            "load_model_gap": gap}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--keep", type=Path, help="leave the last seed's files here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_diabetes(root)
        sys.path.insert(0, str(root))  # the reference trains the same task module centrally
        references = {seed: central(root, args.rounds, seed) for seed in args.seeds}
        sites = clinics(root)  # after the reference: it pools the rows as written
        installs = install_task_package(
            root, ["coordinator", *(f"site{i}" for i in range(len(sites)))]
        )
        first = installs["coordinator"]
        steps = [("certs", "init", "--out", "tls", "--host", "localhost")]
        for i, path in enumerate(sites):
            steps += [("sites", "new-key", "--out", f"site{i}.key"),
                      ("sites", "add-key", "tls", f"site{i}.pub", "--name", path.stem)]  # fmt: skip
        for step in steps:
            done = run_fedweave(root, first, *step)
            if done.returncode != 0:
                raise SystemExit(f"{' '.join(step)} failed: {done.stderr[-1000:]}")
        print(f"diabetes consortium, deployed (TLS, site keys, SecAgg+), task package "
              f"clinic-task 1.2.0 installed per site, {args.rounds} rounds at the task's "
              "defaults; test 52 rows")  # fmt: skip
        print(f"{'seed':>4} {'central rmse':>13} {'mae':>7} {'fed rmse':>9} {'mae':>7} "
              f"{'ratio':>6} {'load_model vs predict':>22}")  # fmt: skip
        ratios = []
        for seed in args.seeds:
            run_id, db = deployed(root, installs, sites, args.rounds, seed)
            together = scored(root, first, run_id, db, seed)
            alone = references[seed]
            ratios.append(together["rmse"] / alone["rmse"])
            print(
                f"{seed:>4} {alone['rmse']:>13.2f} {alone['mae']:>7.2f} "
                f"{together['rmse']:>9.2f} {together['mae']:>7.2f} {ratios[-1]:>6.3f} "
                f"{together['load_model_gap']:>22.1e}", flush=True,
            )  # fmt: skip
        print(f"federated / central RMSE, mean over seeds: {np.mean(ratios):.3f}")
        if args.keep:
            shown = run_fedweave(root, first, "history", "show", run_id, "--db", db)
            (root / "history-show.txt").write_text(shown.stdout + shown.stderr)
            run_fedweave(root, first, "history", "plot", run_id, "--db", db, "--out", "plot.png")
            skipped = shutil.ignore_patterns("installs", "state-*", "*.key")
            shutil.copytree(root, args.keep, dirs_exist_ok=True, ignore=skipped)


if __name__ == "__main__":
    main()
