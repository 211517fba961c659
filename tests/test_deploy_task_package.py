"""A consortium's own regression task as a package, deployed (issue 34).

Four clinics of scikit-learn's diabetes table (one file with its columns reversed, one with
an extra ``patient_id``, one spelling ``bmi`` as ``BMI`` and mapping it with ``--columns
map.toml``) and a coordinator with no data, each process seeing only its own install of the
task package ``clinic-task`` (a ``.dist-info`` with its ``fedweave.tasks`` entry point, as
pip leaves it); ``--task diabetes`` everywhere; TLS, site keys, SecAgg+. The run pins the
package; every console speaks of MAE, not accuracy; the label is standardised with the
statistics gathered through SecAgg+; the exported model, loaded with ``fedweave.load_model``
on the raw held-out CSV, predicts what ``fedweave predict`` writes, to 1e-6."""

from __future__ import annotations

import csv
import json

import numpy as np
import pandas as pd
import pytest
from test_deploy_support import (
    Processes,
    free_port,
    recorded,
    register_named_sites,
    run_fedweave,
    wait_for,
    wait_for_success,
)

ROUNDS = 3
TASK = """from fedweave import Label, Numeric, TabularTask

task = TabularTask(
    name="diabetes",
    features=[Numeric(n) for n in ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5",
                                   "s6")],
    label=Label("progression", kind="regression"),
)
"""


def _install(root, version: str = "1.2.0"):
    """``clinic-task`` as pip installs it, under ``root`` (that process's PYTHONPATH)."""
    info = root / f"clinic_task-{version}.dist-info"
    info.mkdir(parents=True)
    metadata = f"Metadata-Version: 2.1\nName: clinic-task\nVersion: {version}\n"
    (info / "METADATA").write_text(metadata)
    (info / "entry_points.txt").write_text("[fedweave.tasks]\ndiabetes = clinic_task:task\n")
    (root / "clinic_task.py").write_text(TASK)
    return {"PYTHONPATH": str(root)}


def _clinics(root):
    """Four clinics of 40/80/120/150 patients, as the issue describes them, and 52 held out."""
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes(scaled=False)
    frame = pd.DataFrame(bunch.data, columns=bunch.feature_names)
    frame["progression"] = bunch.target
    frame = frame.iloc[np.random.default_rng(34).permutation(len(frame))]
    parts, start = [], 0
    for size in (40, 80, 120, 150):
        parts.append(frame.iloc[start : start + size].copy())
        start += size
    parts[1] = parts[1][list(reversed(parts[1].columns))]
    parts[2].insert(0, "patient_id", [f"P{i:04d}" for i in range(len(parts[2]))])
    parts[3] = parts[3].rename(columns={"bmi": "BMI"})
    (root / "sites").mkdir()
    paths = []
    for i, part in enumerate(parts):
        paths.append(root / "sites" / f"clinic-{i}.csv")
        part.to_csv(paths[-1], index=False)
    (root / "map.toml").write_text('[columns]\nBMI = "bmi"\n')
    frame.iloc[start:].drop(columns=["progression"]).to_csv(root / "new.csv", index=False)
    return paths, frame.iloc[start:]["progression"].to_numpy()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_task_package_at_four_clinics_deployed_with_tls_and_secagg(tmp_path):
    sites, truth = _clinics(tmp_path)
    coordinator_env = _install(tmp_path / "installs" / "coordinator")
    register_named_sites(tmp_path, [path.stem for path in sites])
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port = free_port()
    procs = Processes(tmp_path)
    try:
        coord = procs.start(
            "coordinator", "coordinator", "--address", f"127.0.0.1:{port}",
            "--task", "diabetes", "--rounds", str(ROUNDS), "--min-clients", "4",
            "--db", db, "--tls-dir", "tls", "--once", env=coordinator_env,
        )  # fmt: skip
        wait_for(
            lambda: "sites connected" in procs.output("coordinator"), 60,
            "the coordinator to listen", coord, lambda: procs.output("coordinator"),
        )  # fmt: skip
        for i, path in enumerate(sites):
            mapped = ["--columns", "map.toml"] if "BMI" in path.read_text().split("\n")[0] else []
            procs.start(
                f"site{i}", "client", "--coordinator", f"127.0.0.1:{port}",
                "--task", "diabetes", "--data", str(path), "--ca-cert", "tls/ca.pem",
                "--site-key", f"site{i}.key", "--name", path.stem, *mapped,
                env=_install(tmp_path / "installs" / f"site{i}"),
            )  # fmt: skip
        wait_for_success(procs, coord, "the run", 480)
        rounds, _, run = recorded(db)
    finally:
        procs.close()
    assert run.status == "completed" and len(rounds) == ROUNDS
    assert all(r["replied"] == 4 for r in rounds)
    assert run.config["task_package"] == {
        "task": "diabetes", "package": "clinic-task", "version": "1.2.0"
    }  # fmt: skip
    statistics = rounds[0]["extra"]["statistics"]
    assert 100 < statistics["label_mean"] < 200 and 50 < statistics["label_std"] < 100
    coordinator_out = procs.output("coordinator")
    assert "SecAgg+ on" in coordinator_out and "TLS on" in coordinator_out
    assert coordinator_out.count("federated (4/4 sites): loss") == ROUNDS
    assert "mae" in coordinator_out and "accuracy" not in coordinator_out, coordinator_out
    for i in range(len(sites)):
        site_out = procs.output(f"site{i}")
        assert "accuracy" not in site_out and "mae" in site_out, site_out[-2000:]
    mapped_sites = [i for i, path in enumerate(sites) if "BMI" in path.read_text()]
    assert "map.toml: BMI -> bmi" in procs.output(f"site{mapped_sites[0]}")

    shown = run_fedweave("history", "show", run.run_id, "--db", db, cwd=tmp_path)
    assert shown.returncode == 0 and "mae" in shown.stdout, shown.stderr
    out = tmp_path / "export"
    done = run_fedweave("history", "export", run.run_id, "--db", db, "--to", str(out),
                        cwd=tmp_path, env=coordinator_env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "run.json").read_text())
    assert summary["headline"] == "mae" and {"mae", "rmse"} <= set(summary["final_metrics"])
    done = run_fedweave("predict", "--run", run.run_id, "--db", db, "--data", "new.csv",
                        "--out", "p.csv", cwd=tmp_path, env=coordinator_env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    predicted = pd.read_csv(tmp_path / "p.csv")["prediction"].to_numpy()
    rmse = float(np.sqrt(np.mean((predicted - truth) ** 2)))
    assert rmse < 70, rmse  # predicting the mean: about 78; the label scaled, 3 rounds learn

    import fedweave

    with open(tmp_path / "new.csv", newline="") as handle:
        rows = fedweave.load_model(out).predict(csv.DictReader(handle))
    np.testing.assert_allclose([row["prediction"] for row in rows], predicted, rtol=0, atol=1e-6)
