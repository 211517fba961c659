"""`fedweave simulate --data-dir`: hospitals' own CSVs as sites (unequal sizes, reordered and
extra columns), standardised with statistics gathered through SecAgg+, reaching the accuracy
of a centrally trained model; bad files refused before anything is recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from fedweave.history import open_store
from fedweave.learning.evaluation_split import held_out_indices
from fedweave.learning.tasks.breast_cancer import write_hospital_files

FEDWEAVE = [sys.executable, "-m", "fedweave.cli"]


def simulate(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*FEDWEAVE, "simulate", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def hospitals(tmp_path_factory):
    root = tmp_path_factory.mktemp("hospitals")
    sites, test = write_hospital_files(root / "sites")
    return root, sites, test


def test_hospital_files_train_together_under_secagg(hospitals, tmp_path):
    root, sites, test = hospitals
    db = f"sqlite:///{tmp_path / 'h.db'}"
    result = simulate(
        "--task", "breast-cancer", "--data-dir", str(root / "sites"), "--test-data", str(test),
        "--rounds", "8", "--db", db, "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "SecAgg+ on" in result.stderr
    assert result.stderr.count("ignoring column(s) the task does not use: patient_id") >= 1
    with open_store(db) as store:
        run = store.list_runs()[0]
        rounds = store.rounds(run.run_id)
    assert len(rounds) == 8 and rounds[-1]["eval_accuracy"] >= 0.95
    assert all(r["replied"] == 3 for r in rounds)
    # The statistics gathered through SecAgg+ are the pooled ones of what the sites train
    # on (their evaluation part held out; up to SecAgg+'s quantization), and they were
    # recorded with the run's first round only.
    frames = [pd.read_csv(p) for p in sites]
    pooled = pd.concat([f.iloc[held_out_indices(len(f), 0.1)[0]] for f in frames])
    statistics = rounds[0]["extra"]["statistics"]
    names = [c for c in pd.read_csv(sites[0]).columns if c != "diagnosis"]
    assert np.allclose(statistics["means"], pooled[names].mean().to_numpy(), rtol=1e-3)
    assert np.allclose(statistics["stds"], pooled[names].std(ddof=0).to_numpy(), rtol=1e-2)
    assert all("statistics" not in (r["extra"] or {}) for r in rounds[1:])
    # every site scored each round's model on its own held-out part, AUC included
    for row in rounds:
        evaluation = row["extra"]["evaluation"]
        assert [s["status"] for s in evaluation["sites"]] == ["ok"] * 3
        assert {"loss", "accuracy", "auc"} <= set(evaluation["federated"])
        assert {"loss", "accuracy", "auc"} <= set(evaluation["central"])
    assert rounds[-1]["extra"]["evaluation"]["federated"]["auc"] >= 0.95


def test_local_dp_noises_the_updates_and_gathers_no_statistics(hospitals, tmp_path):
    """Issue 33: ``--dp local`` also noised the statistics the sites send before round 1
    (Flower's ``LocalDpMod`` on every fit message): under SecAgg+ every site refused them
    (``4.84e+23 after weighting exceeds the secure-aggregation range``) and the run
    failed; without it, feature means of -6.5e13 were recorded and trained on. Those
    statistics are not a DP release either: a DP run now gathers none, and scales with the
    task's declared column bounds (recorded with round 1 as gathered ones are).

    The same run keeps its privacy ledger: each round's epsilon on the console line, in the
    history (``history show``, table and JSON) and the report, and ``--max-epsilon 20`` ends
    it, completed with the reason, after round 2 of 3 (a round of LocalDpMod's noise for
    epsilon 10 spends 11.15 by the RDP account; two 17.19, three 22.34)."""
    root, sites, test = hospitals
    db = f"sqlite:///{tmp_path / 'h.db'}"
    out = tmp_path / "out"
    result = simulate(
        "--task", "breast-cancer", "--data-dir", str(root / "sites"), "--test-data", str(test),
        "--rounds", "3", "--dp", "local", "--max-epsilon", "20", "--db", db, "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "SecAgg+ on" in result.stderr
    assert "DP local clipping norm 1 epsilon per round 10 delta per round 1e-05" in result.stderr
    with open_store(db) as store:
        run = store.list_runs()[0]
        round_1, round_2 = store.rounds(run.run_id)
    from fedweave.learning.tasks.breast_cancer import task
    from fedweave.privacy.statement import statement

    assert round_1["extra"]["statistics"] == task.declared_statistics()
    assert "statistics: none gathered from the sites" in result.stderr
    assert round_1["replied"] == 3
    spent = [r["extra"]["privacy"]["epsilon"] for r in (round_1, round_2)]
    assert [round(e, 2) for e in spent] == [11.15, 17.19]
    assert "epsilon 11.146 (delta 1e-05)" in result.stderr
    assert run.status == "completed"
    assert run.reason.startswith("privacy budget: stopped before round 3, which would take")
    report = json.loads(out.read_text())
    assert report["privacy"] == {"mechanism": "local", "epsilon": spent[1], "delta": 1e-5,
                                 "rounds": 2, **statement("local")}  # fmt: skip
    assert report["privacy"]["sensitivity"].startswith("2C")
    assert report["ended_early"] == run.reason
    shown = subprocess.run(
        [*FEDWEAVE, "history", "show", run.run_id, "--db", db, "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    rounds = json.loads(shown.stdout)["rounds"]
    assert [(r["epsilon"], r["delta"]) for r in rounds] == [(e, 1e-5) for e in spent]
    table = subprocess.run(
        [*FEDWEAVE, "history", "show", run.run_id, "--db", db],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert "differential privacy local: epsilon 17.190 at delta 1e-05 after round 2" in (
        table.stdout
    )
    assert "(relation replace-one (any two inputs of a site), sensitivity 2C" in " ".join(
        table.stdout.split()
    )


def test_a_dp_run_of_a_task_without_column_bounds_is_one_line(hospitals, tmp_path):
    """Gathering a table's statistics from the sites is not a DP release, so a DP run of a
    task whose numeric columns declare no bounds is refused before anything starts."""
    root, _, test = hospitals
    (tmp_path / "unbounded.py").write_text(
        "from fedweave.learning.tasks.breast_cancer import CLASSES, feature_names\n"
        "from fedweave.learning.tables import Label, Numeric\n"
        "from fedweave.learning.tasks.tabular import TabularTask\n"
        "task = TabularTask('unbounded', [Numeric(n) for n in feature_names()],\n"
        "                   Label('diagnosis', kind='binary', classes=CLASSES))\n"
    )
    db = tmp_path / "h.db"
    result = subprocess.run(
        [*FEDWEAVE, "simulate", "--task", "unbounded:task", "--data-dir", str(root / "sites"),
         "--test-data", str(test), "--dp", "sample", "--db", f"sqlite:///{db}",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "--dp sample: task 'unbounded:task' scales its features with statistics" in lines[0]
    assert "(mean radius, mean texture, mean perimeter and 27 more)" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_sample_dp_delta_the_smallest_site_would_refuse_is_one_line(hospitals, tmp_path):
    root, sites, test = hospitals
    smallest = min(len(pd.read_csv(p)) for p in sites)
    result = simulate(
        "--task", "breast-cancer", "--data-dir", str(root / "sites"), "--test-data", str(test),
        "--dp", "sample", "--dp-delta", "0.02", "--db", f"sqlite:///{tmp_path / 'h.db'}",
        "--out", str(tmp_path / "out"), timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: --dp-delta 0.02 is above 1 / (10 x the {smallest} examples of hospital-c), "
        f"the smallest site, which would refuse every round (a guarantee that may fail for one "
        f"example in {smallest} protects none); run with --dp-delta {1 / (10 * smallest):g} "
        "or below"
    )
    with open_store(f"sqlite:///{tmp_path / 'h.db'}") as store:
        assert store.list_runs() == []


def _with_cell(text: str, line: int, column: int, value: str) -> str:
    lines = text.splitlines()
    cells = lines[line].split(",")
    cells[column] = value
    lines[line] = ",".join(cells)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.write_text(p.read_text().replace("malignant", "maybe", 1)), "'maybe' is not"),
        (lambda p: p.write_text(_with_cell(p.read_text(), 3, 5, "nan")), "line 4, column"),
        (lambda p: p.write_text(_with_cell(p.read_text(), 2, 7, "")), "missing value"),
        (lambda p: p.write_text(""), "the file is empty"),
    ],
)
def test_a_bad_site_file_is_one_line_before_anything_is_recorded(
    hospitals, tmp_path, damage, message
):
    root, sites, test = hospitals
    site_dir = tmp_path / "sites"
    site_dir.mkdir()
    for path in sites:
        (site_dir / path.name).write_text(path.read_text())
    damage(site_dir / sites[1].name)
    db = f"sqlite:///{tmp_path / 'h.db'}"
    result = simulate(
        "--task", "breast-cancer", "--data-dir", str(site_dir), "--test-data", str(test),
        "--rounds", "2", "--db", db, "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "hospital-b.csv" in lines[0], result.stderr[-2000:]
    assert message in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "h.db").exists() or not open_store(db).list_runs()


def test_clients_must_match_the_site_files(hospitals, tmp_path):
    root, _, test = hospitals
    result = simulate(
        "--task", "breast-cancer", "--data-dir", str(root / "sites"), "--test-data", str(test),
        "--clients", "5", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert result.returncode == 2
    assert "holds 3 sites; leave --clients out" in result.stderr


def test_a_regression_table_learns_at_its_defaults_and_reports_its_own_metrics(
    hospitals, tmp_path
):
    """A user's regression task (predict 'mean area', in the hundreds, from the other
    measurements) at the task's own training defaults, SecAgg+ on: the label is
    standardised with a mean and deviation gathered with the features' (so it learns in
    three rounds), every metric and prediction is in the label's units, and the console,
    the closing line and the report lead with its MAE, not an empty accuracy."""
    root, sites, test = hospitals
    (tmp_path / "area_task.py").write_text(
        "from fedweave.learning.tables import Label, Numeric\n"
        "from fedweave.learning.tasks.breast_cancer import feature_names\n"
        "from fedweave.learning.tasks.tabular import TabularTask\n"
        "task = TabularTask('area', [Numeric(n) for n in feature_names() if n != 'mean area'],\n"
        "                   Label('mean area', kind='regression'))\n"
    )
    db = f"sqlite:///{tmp_path / 'h.db'}"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [*FEDWEAVE, "simulate", "--task", "area_task:task", "--data-dir", str(root / "sites"),
         "--test-data", str(test), "--rounds", "3", "--db", db, "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "accuracy" not in result.stderr
    assert result.stderr.count("  mae ") >= 3 and "final mae " in result.stderr
    report = json.loads((tmp_path / "out").read_text())
    assert report["headline"] == "mae" and report["final_accuracy"] is None
    assert set(report["final_metrics"]) == {"loss", "mae", "rmse"}
    assert report["rounds"][-1]["mae"] == report["final_metrics"]["mae"]
    with open_store(db) as store:
        run = store.list_runs()[0]
        rounds = store.rounds(run.run_id)
    frames = [pd.read_csv(p) for p in sites]
    pooled = pd.concat([f.iloc[held_out_indices(len(f), 0.1)[0]] for f in frames])["mean area"]
    statistics = rounds[0]["extra"]["statistics"]
    assert statistics["label_mean"] == pytest.approx(pooled.mean(), rel=1e-3)
    assert statistics["label_std"] == pytest.approx(pooled.std(ddof=0), rel=1e-2)
    central = rounds[-1]["extra"]["evaluation"]["central"]
    truth = pd.read_csv(test)["mean area"].to_numpy()
    assert central["rmse"] < 0.5 * truth.std()  # the mean's RMSE is truth.std()
    predicted = subprocess.run(
        [*FEDWEAVE, "predict", "--run", run.run_id, "--data", str(test), "--db", db,
         "--out", str(tmp_path / "p.csv")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr[-2000:]
    values = pd.read_csv(tmp_path / "p.csv")["prediction"].to_numpy()
    assert np.sqrt(np.mean((values - truth) ** 2)) == pytest.approx(central["rmse"], rel=1e-4)
    from fedweave.history.metrics import recorded_headline

    assert recorded_headline(rounds) == "mae"
    plotted = subprocess.run(
        [*FEDWEAVE, "history", "plot", run.run_id, "--db", db, "--out", str(tmp_path / "p.png")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert plotted.returncode == 0 and (tmp_path / "p.png").stat().st_size > 10_000
