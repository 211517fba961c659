"""Every DP mode on two tables: breast-cancer (classification) and a regression table of
clinics' diabetes records, each scaled with its declared column bounds under DP (issue 33).

    python bench/bench_dp_tables.py
    python bench/bench_dp_tables.py --tables diabetes --modes none sample

A DP run gathers no statistics from the sites' data (they are not a DP release): a tabular
task's numeric columns declare public bounds, and a DP run scales with those instead.
Every run is a real ``fedweave simulate`` over per-site CSVs (``--data-dir``, SecAgg+ on, the
default) with the table's own held-out test file, the same seed and training flags in every
mode of a table:

- breast-cancer: the three hospital files of ``write_hospital_files``, 10 rounds;
- diabetes: scikit-learn's diabetes table unscaled (442 patients, 10 measurements, a
  continuous disease-progression label), as four clinics of 40/80/120/150 rows and a test file
  of the other 52, with a ``TabularTask`` declaring clinical bounds (``DIABETES_TASK``);
  30 rounds of 5 local epochs at lr 0.05 (the task defaults' five rounds do not reach the
  mean's RMSE; the label is not scaled).

Modes: ``none``; ``central`` (``--noise-multiplier``, site-level); ``local``
(``--dp-epsilon``, site-level); ``sample`` (DP-SGD at every site, its noise multiplier sized
with Opacus's ``get_noise_multiplier`` so the smallest site spends ``--sample-epsilon``).
Prints per run the headline metric (accuracy, or RMSE for the regression), the run's final
epsilon at delta 1e-5, and the seconds it took.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DIABETES_TASK = '''
from fedweave import Label, Numeric, TabularTask

BOUNDS = {  # clinical ranges, not the table's own minima and maxima
    "age": (18, 100), "sex": (1, 2), "bmi": (10, 60), "bp": (40, 200),
    "s1": (50, 400), "s2": (0, 300), "s3": (10, 120), "s4": (1, 12), "s5": (2, 8),
    "s6": (40, 200),
}
task = TabularTask(
    name="diabetes",
    features=[Numeric(name, bounds=bounds) for name, bounds in BOUNDS.items()],
    label=Label("progression", kind="regression"),
)
'''

TABLES = {
    "breast-cancer": {"task": "breast-cancer", "flags": ["--rounds", "10"], "metric": "accuracy"},
    "diabetes": {
        "task": "diabetes_task:task",
        "flags": ["--rounds", "30", "--local-epochs", "5", "--lr", "0.05"],
        "metric": "rmse",
    },
}


def write_diabetes(root: Path) -> None:
    import numpy as np
    import pandas as pd
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes(scaled=False)
    frame = pd.DataFrame(bunch.data, columns=bunch.feature_names)
    frame["progression"] = bunch.target
    frame = frame.iloc[np.random.default_rng(20261202).permutation(len(frame))]
    (root / "sites").mkdir(parents=True)
    start = 0
    for index, size in enumerate((40, 80, 120, 150)):
        frame.iloc[start : start + size].to_csv(root / "sites" / f"clinic-{index}.csv", index=False)
        start += size
    frame.iloc[start:].to_csv(root / "test.csv", index=False)
    (root / "diabetes_task.py").write_text(DIABETES_TASK)


def simulate(
    root: Path, table: dict, name: str, *extra: str
) -> tuple[dict, list[dict], list[dict], float]:
    from fedweave.history import open_store

    db = f"sqlite:///{root / (name + '.db')}"
    command = [
        sys.executable, "-m", "fedweave.cli", "simulate", "--task", table["task"],
        "--data-dir", str(root / "sites"), "--test-data", str(root / "test.csv"),
        "--seed", "0", *table["flags"], "--checkpoint-dir", str(root / name), "--db", db,
        "--out", str(root / f"{name}.json"), *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    with open_store(db) as store:
        run = store.list_runs()[0]
        rows = store.rounds(run.run_id)
        sites = store.site_results(run.run_id, 1)
    return json.loads((root / f"{name}.json").read_text()), rows, sites, seconds


def sample_multiplier(sites: list[dict], table: dict, epsilon: float, batch: int = 32) -> float:
    from opacus.accountants.utils import get_noise_multiplier

    flags = table["flags"]
    rounds = int(flags[flags.index("--rounds") + 1])
    epochs = int(flags[flags.index("--local-epochs") + 1]) if "--local-epochs" in flags else 1
    smallest = min(s["num_examples"] for s in sites if s["status"] == "ok")
    batches = max(1, math.ceil(smallest / batch))
    return get_noise_multiplier(
        target_epsilon=epsilon, target_delta=1e-5, sample_rate=1 / batches,
        steps=rounds * epochs * batches, accountant="rdp",
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="+", choices=sorted(TABLES), default=sorted(TABLES))
    parser.add_argument("--modes", nargs="+", choices=("none", "central", "local", "sample"),
                        default=["none", "central", "local", "sample"])
    parser.add_argument("--noise-multiplier", type=float, default=0.5,
                        help="central DP's (default 0.5)")
    parser.add_argument("--dp-epsilon", type=float, default=10.0,
                        help="local DP's per round (default 10)")
    parser.add_argument("--sample-epsilon", type=float, default=3.0,
                        help="sample DP's target for the smallest site (default 3)")
    parser.add_argument("--clipping-norm", type=float, default=1.0)
    args = parser.parse_args()

    print(f"{'table':<14} {'mode':<8} {'noise':>12} {'metric':>16} {'epsilon':>9} {'s':>6}")
    for table_name in args.tables:
        table = TABLES[table_name]
        with tempfile.TemporaryDirectory(prefix="fw-dp-tables-") as name:
            root = Path(name)
            if table_name == "diabetes":
                write_diabetes(root)
            else:
                from fedweave.learning.tasks.breast_cancer import write_hospital_files

                write_hospital_files(root / "sites")
            plain_sites: list[dict] = []
            for mode in ["none", *[m for m in args.modes if m != "none"]]:
                clip = ["--clipping-norm", str(args.clipping_norm)]
                extra, noise = [], "-"
                if mode == "central":
                    extra = ["--dp", "central", "--noise-multiplier", str(args.noise_multiplier),
                             *clip]  # fmt: skip
                    noise = f"z {args.noise_multiplier:g}"
                elif mode == "local":
                    extra = ["--dp", "local", "--dp-epsilon", str(args.dp_epsilon), *clip]
                    noise = f"eps/rd {args.dp_epsilon:g}"
                elif mode == "sample":
                    z = sample_multiplier(plain_sites, table, args.sample_epsilon)
                    extra = ["--dp", "sample", "--noise-multiplier", f"{z:.4f}", *clip]
                    noise = f"z {z:.3f}"
                report, rows, sites, seconds = simulate(root, table, mode, *extra)
                if mode == "none":
                    plain_sites = sites
                if mode == "none" and "none" not in args.modes:
                    continue
                central = rows[-1]["extra"]["evaluation"]["central"]
                value = central[table["metric"]]
                epsilon = (report.get("privacy") or {}).get("epsilon")
                shown = "-" if epsilon is None else f"{epsilon:.3f}"
                metric = f"{table['metric']} {value:.4f}"
                print(f"{table_name:<14} {mode:<8} {noise:>12} {metric:>16} {shown:>9} "
                      f"{seconds:>6.0f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
