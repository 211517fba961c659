"""Evaluation where the data is (issue 21): sites score the global model on their own held-out
part, every metric the task computes is kept, a coordinator without data runs on federated
evaluation alone, and the model comes out named (safetensors) and scores new files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedweave.coordinator.rounds.federated_evaluation import (
    MAX_EVALUATION_WEIGHT,
    is_evaluation_round,
    weighted_evaluation,
)
from fedweave.coordinator.rounds.site_weights import MAX_TIMES_MEDIAN
from fedweave.history import open_store
from fedweave.history.metrics import best_round, lower_is_better, qualified, round_metrics
from fedweave.learning.evaluation_split import hold_out
from fedweave.learning.task import ArrayData
from fedweave.learning.tasks import load_task
from fedweave.learning.tasks.breast_cancer import write_hospital_files
from fedweave.learning.training import TrainConfig

FEDWEAVE = [sys.executable, "-m", "fedweave.cli"]


def fedweave(*args: str, cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*FEDWEAVE, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def simulate_hospitals(
    root: Path, tmp_path: Path, *args: str, timeout: float = 400
) -> subprocess.CompletedProcess:
    """``fedweave simulate`` of the three hospital files under ``root``, recorded in
    ``tmp_path/h.db``."""
    return fedweave(
        "simulate", "--task", "breast-cancer", "--data-dir", str(root / "sites"),
        "--db", f"sqlite:///{tmp_path / 'h.db'}", "--out", str(tmp_path / "r.json"), *args,
        cwd=tmp_path, timeout=timeout,
    )  # fmt: skip


class _Res:
    def __init__(self, loss: float, n: int, metrics: dict) -> None:
        self.loss, self.num_examples, self.metrics = loss, n, metrics


def test_the_federated_figures_are_example_weighted_over_the_sites_that_report_them():
    results = [
        (None, _Res(1.0, 10, {"accuracy": 0.5, "auc": 0.9, "seconds": 3.0, "fw-site-name": "a"})),
        (None, _Res(3.0, 30, {"accuracy": 0.9})),  # no auc from this one
        (None, _Res(9.0, 0, {"accuracy": 0.0})),  # no examples: counts for nothing
    ]
    got = weighted_evaluation(results)  # type: ignore[arg-type]
    assert got == pytest.approx({"loss": 2.5, "accuracy": 0.8, "auc": 0.9})
    # a site claiming a billion examples weighs in with at most MAX_EVALUATION_WEIGHT, and
    # at most MAX_TIMES_MEDIAN times the lower median site (site_weights.py): here 2 x 30
    boastful = [(None, _Res(0.0, 10**9, {"accuracy": 1.0})), *results[:2]]
    claimed = weighted_evaluation(boastful)  # type: ignore[arg-type]
    cap = min(MAX_EVALUATION_WEIGHT, MAX_TIMES_MEDIAN * 30)
    assert claimed["accuracy"] == pytest.approx((cap * 1.0 + 5 + 27) / (cap + 40))
    many = [(None, _Res(0.0, 6000, {"accuracy": 0.5})) for _ in range(3)]
    huge = weighted_evaluation([*many, (None, _Res(0.0, 10**9, {"accuracy": 1.0}))])
    cap = MAX_EVALUATION_WEIGHT  # below 2 x 6000
    assert huge["accuracy"] == pytest.approx((cap * 1.0 + 18000 * 0.5) / (cap + 18000))


def test_evaluation_rounds_are_every_nth_and_the_last():
    assert [r for r in range(1, 8) if is_evaluation_round(r, 3, 7)] == [3, 6, 7]
    assert [r for r in range(1, 4) if is_evaluation_round(r, 1, 3)] == [1, 2, 3]
    assert not any(is_evaluation_round(r, 0, 3) for r in range(1, 4))


def test_a_sites_held_out_part_is_disjoint_fixed_and_never_all_of_it():
    data = ArrayData(np.arange(50, dtype=np.float32).reshape(50, 1), np.arange(50))
    train, held = hold_out(data, 0.1)
    assert len(held) == 5 and len(train) == 45
    assert not set(held.y.tolist()) & set(train.y.tolist())
    again_train, again_held = hold_out(data, 0.1)
    assert np.array_equal(again_held.y, held.y) and np.array_equal(again_train.y, train.y)
    tiny = ArrayData(np.zeros((2, 1), dtype=np.float32), np.array([0, 1]))
    assert [len(part) for part in hold_out(tiny, 0.9)] == [1, 1]
    assert hold_out(data, 0.0)[1] is None


def test_the_best_round_follows_the_metric_and_its_direction():
    def row(number: int, **evaluation: dict) -> dict:
        return {"round": number, "actor": "c", "extra": {"evaluation": evaluation}}

    rows = [
        row(1, federated={"loss": 0.5, "auc": 0.8}),
        row(2, federated={"loss": 0.4, "auc": 0.7}),
        row(3, central={"loss": 0.1}),
    ]
    assert best_round(rows, "auc") == (1, "federated.auc", 0.8)
    # the coordinator's own score, where the run has one, before any site's word
    assert best_round(rows, "loss") == (3, "central.loss", 0.1)
    assert best_round(rows, "federated.loss") == (2, "federated.loss", 0.4)
    assert best_round(rows, "central.loss") == (3, "central.loss", 0.1)
    assert best_round(rows, "auc", "min") == (2, "federated.auc", 0.7)
    assert best_round(rows, "f1") is None
    assert qualified(rows, "loss") == "federated.loss"


def test_a_site_claiming_a_tiny_loss_on_a_billion_examples_does_not_pick_the_best_round():
    """Issue 73's review: one site reporting loss 1e-6 on 10**9 examples in round 1 made
    round 1 the best by federated.loss (0.63 centrally against 0.92 in round 4), and the
    export its model. The choice rests on the median of the sites' own figures, said with
    it; with fewer than three sites answering, the recorded mean."""
    from types import SimpleNamespace

    from fedweave.history.model_export import chosen_rounds

    honest = {1: 1.2, 2: 0.8, 3: 0.5, 4: 0.3}

    def row(number: int, liar: bool = True) -> dict:
        sites = [{"site": f"s{i}", "status": "ok", "examples": 50,
                  "metrics": {"loss": honest[number] + i / 100}} for i in range(3)]  # fmt: skip
        if liar:
            sites.append({"site": "insider", "status": "ok", "examples": 10**9,
                          "metrics": {"loss": 1e-6 if number == 1 else 9.0}})  # fmt: skip
        mean = 1e-6 if number == 1 and liar else honest[number]  # as the weighted mean said
        return {"round": number, "actor": "coordinator", "checkpoint_path": f"r{number}.npz",
                "extra": {"evaluation": {"federated": {"loss": mean}, "sites": sites}}}  # fmt: skip

    info = SimpleNamespace(config={"settings": {"evaluation": {"select_metric": "loss"}}})
    rows = [row(n) for n in (1, 2, 3, 4)]
    _, best, chosen = chosen_rounds(info, rows)
    assert best["round"] == 4, chosen
    assert chosen["statistic"] == "the median of the sites' own figures"
    assert chosen["value"] == pytest.approx((0.31 + 0.32) / 2)  # of s1, s2 (9.0 is an outlier)
    two = [{**r, "extra": {"evaluation": {"federated": {"loss": v},
            "sites": r["extra"]["evaluation"]["sites"][:2]}}}
           for r, v in zip(rows, (0.9, 0.2, 0.5, 0.6))]  # fmt: skip
    _, best, chosen = chosen_rounds(info, two)
    assert best["round"] == 2 and chosen["statistic"].startswith("the recorded mean")
    assert lower_is_better("federated.rmse") and not lower_is_better("central.accuracy")


@pytest.fixture(scope="module")
def hospitals(tmp_path_factory):
    root = tmp_path_factory.mktemp("hospitals")
    sites, test = write_hospital_files(root / "sites")
    return root, sites, test


def _evaluate_exported(path: Path, statistics: dict, test: Path) -> dict[str, float]:
    """The exported model, loaded by name into the task's model in plain PyTorch, scored on
    ``test`` with the run's federated statistics."""
    from safetensors.torch import load_file

    task = load_task("breast-cancer")
    model = task.build_model()
    model.load_state_dict(load_file(str(path)), strict=True)
    data = task.prepare(task.read_site_data(test), statistics)
    return task.evaluate(model, data, TrainConfig())


@pytest.mark.slow
def test_a_coordinator_without_data_scores_rounds_at_the_sites(hospitals, tmp_path):
    root, sites, test = hospitals
    db = f"sqlite:///{tmp_path / 'h.db'}"
    done = simulate_hospitals(root, tmp_path, "--rounds", "4", "--select-metric", "auc")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "evaluation federated every round (100% of sites)" in done.stderr
    assert "until the sites' training times are measured, then 5x the slowest" in done.stderr
    assert done.stderr.count("federated (3/3 sites): loss") == 4
    with open_store(db) as store:
        run = store.list_runs()[0]
        rounds = store.rounds(run.run_id)
    for row in rounds:
        evaluation = row["extra"]["evaluation"]
        assert evaluation["central"] == {}
        assert sorted(s["site"] for s in evaluation["sites"]) == [
            "hospital-a", "hospital-b", "hospital-c"
        ]  # fmt: skip
        assert all(s["status"] == "ok" and s["examples"] > 0 for s in evaluation["sites"])
        assert {"loss", "accuracy", "auc"} <= set(evaluation["federated"])
        assert row["eval_loss"] == evaluation["federated"]["loss"]  # the round's headline
        examples = [s["examples"] for s in evaluation["sites"]]
        aucs = [s["metrics"]["auc"] for s in evaluation["sites"]]
        assert evaluation["federated"]["auc"] == pytest.approx(np.average(aucs, weights=examples))
    assert rounds[-1]["extra"]["evaluation"]["federated"]["auc"] >= 0.9

    shown = fedweave("history", "show", run.run_id, "--db", db, "--format", "json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    metrics = json.loads(shown.stdout)["rounds"][-1]["metrics"]
    assert {"federated.auc", "federated.loss", "train.loss"} <= set(metrics)
    table = fedweave("history", "show", run.run_id, "--db", db, "--sites", cwd=tmp_path)
    assert "best round" in table.stdout and "site evaluations" in table.stdout
    plot = fedweave("history", "plot", run.run_id, "--db", db, "--metric", "auc",
                    "--out", str(tmp_path / "auc.png"), cwd=tmp_path)  # fmt: skip
    assert plot.returncode == 0 and (tmp_path / "auc.png").stat().st_size > 10_000, plot.stderr
    unknown = fedweave("history", "plot", run.run_id, "--db", db, "--metric", "f1", cwd=tmp_path)
    assert unknown.returncode == 2 and "federated.auc" in unknown.stderr
    assert "Traceback" not in unknown.stderr

    out = tmp_path / "export"
    exported = fedweave("history", "export", run.run_id, "--db", db, "--to", str(out), cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    meta = json.loads((out / "model.json").read_text())
    assert meta["task"] == "breast-cancer" and meta["final_round"] == 4
    assert meta["best"]["qualified"] == "federated.auc"
    assert meta["statistics"]["means"] and meta["schema"]["digest"]
    evaluations = pd.read_csv(out / "evaluations.csv")
    assert len(evaluations) == 12 and "metrics.auc" in evaluations.columns
    assert "federated.auc" in pd.read_csv(out / "rounds.csv").columns
    scores = _evaluate_exported(out / "model.safetensors", meta["statistics"], test)
    assert scores["accuracy"] >= 0.9
    _evaluate_exported(out / "best.safetensors", meta["statistics"], test)


PLAIN_USE = """
import json, sys
sys.modules["fedweave"] = None  # plain torch and numpy: importing fedweave would fail
"""


def _the_exported_model_predicts_as_predict_does(out: Path, new: Path, predicted) -> None:
    """``fedweave.load_model`` on raw rows, and the docs' recipe without fedweave, give the
    probabilities ``fedweave predict`` wrote, to 1e-6."""
    import csv

    import fedweave

    model = fedweave.load_model(out)
    with open(new, newline="") as handle:
        rows = model.predict(csv.DictReader(handle))
    assert [row["prediction"] for row in rows] == predicted["prediction"].astype(str).tolist()
    np.testing.assert_allclose([row["probability"] for row in rows], predicted["probability"],
                               rtol=0, atol=1e-6)  # fmt: skip
    np.testing.assert_allclose(model(pd.read_csv(new)).numpy(), predicted["probability"],
                               rtol=0, atol=1e-6)  # fmt: skip
    docs = (Path(__file__).parents[1] / "docs" / "evaluation.md").read_text()
    recipe = docs.split("Without fedweave at all")[1].split("```python")[1].split("```")[0]
    recipe = recipe.replace("DIR/", f"{out}/").replace("new.csv", str(new))
    script = PLAIN_USE + recipe + "print(json.dumps(predictions.tolist()))\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=out)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    np.testing.assert_allclose(json.loads(done.stdout), predicted["probability"],
                               rtol=0, atol=1e-6)  # fmt: skip


@pytest.mark.slow
def test_the_exported_model_scores_as_the_history_says_and_predict_agrees(hospitals, tmp_path):
    root, sites, test = hospitals
    db = f"sqlite:///{tmp_path / 'h.db'}"
    done = simulate_hospitals(root, tmp_path, "--rounds", "3", "--test-data", str(test))
    assert done.returncode == 0, done.stderr[-3000:]
    with open_store(db) as store:
        run = store.list_runs()[0]
        final = store.rounds(run.run_id)[-1]
    central = final["extra"]["evaluation"]["central"]
    assert {"loss", "accuracy", "auc"} <= set(central)
    out = tmp_path / "export"
    assert fedweave("history", "export", "latest", "--db", db, "--to", str(out),
                    cwd=tmp_path).returncode == 0  # fmt: skip
    statistics = json.loads((out / "model.json").read_text())["statistics"]
    scores = _evaluate_exported(out / "model.safetensors", statistics, test)
    for name in ("loss", "accuracy", "auc"):
        assert scores[name] == pytest.approx(central[name], rel=1e-5), name

    # predict: the same model on the same file, without its label column
    frame = pd.read_csv(test)
    frame.drop(columns=["diagnosis"]).to_csv(tmp_path / "new.csv", index=False)
    predicted = fedweave("predict", "--run", "latest", "--db", db, "--data",
                         str(tmp_path / "new.csv"), "--out", str(tmp_path / "p.csv"),
                         cwd=tmp_path)  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr
    assert f"by the model of round {final['round']}" in predicted.stdout
    predictions = pd.read_csv(tmp_path / "p.csv")
    assert len(predictions) == len(frame)
    right = (predictions["prediction"].astype(str) == frame["diagnosis"].astype(str)).mean()
    assert right == pytest.approx(central["accuracy"], abs=1e-9)
    assert predictions["probability"].between(0, 1).all()
    _the_exported_model_predicts_as_predict_does(out, tmp_path / "new.csv", predictions)

    # a file that lacks a column the model reads: one line, exit 2
    frame.drop(columns=["diagnosis", "mean radius"]).to_csv(tmp_path / "bad.csv", index=False)
    bad = fedweave("predict", "--run", "latest", "--db", db, "--data", str(tmp_path / "bad.csv"),
                   cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2 and "mean radius" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "predictions.csv").exists()


@pytest.mark.slow
def test_a_site_that_cannot_evaluate_is_recorded_and_the_round_goes_on(tmp_path):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    done = fedweave(
        "simulate", "--task", "digits", "--clients", "3", "--rounds", "3", "--eval-fraction", "0",
        "--evaluate-every", "2", "--db", db, "--out", str(tmp_path / "r.json"), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with open_store(db) as store:
        run = store.list_runs()[0]
        rounds = store.rounds(run.run_id)
    assert run.status == "completed" and [r["replied"] for r in rounds] == [3, 3, 3]
    evaluated = [r["round"] for r in rounds if r["extra"].get("evaluation", {}).get("sites")]
    assert evaluated == [2, 3]  # every 2nd round and the last
    for row in rounds:
        assert row["eval_accuracy"] is not None  # central evaluation on digits' test split
        for site in row["extra"]["evaluation"].get("sites", []):
            assert site["status"] == "refused"
            assert "holds no evaluation data" in site["reason"], site
    assert "evaluation refused: this site holds no evaluation data" in done.stderr


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--fraction-evaluate", "0"], "--fraction-evaluate"),
        (["--select-metric", "f1"], "computes loss, accuracy, auc"),
        (["--evaluate-every", "0"], "--test-data"),
    ],
    ids=["no-share", "unknown-metric", "nothing-scores"],
)
def test_evaluation_settings_that_cannot_work_are_refused_before_round_1(
    hospitals, tmp_path, args, expected
):
    root, _, _ = hospitals
    done = simulate_hospitals(root, tmp_path, "--rounds", "1", *args, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert expected in done.stderr and "Traceback" not in done.stderr
    assert "round 1" not in done.stderr


def test_predict_on_a_run_without_a_model_says_so(tmp_path):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    with open_store(db) as store:
        store.start_run("federated", "digits", {}, 0)
    np.savez(tmp_path / "x.npz", x=np.zeros((2, 64), dtype=np.float32), y=np.zeros(2))
    done = fedweave("predict", "--run", "latest", "--db", db, "--data", str(tmp_path / "x.npz"),
                    cwd=tmp_path, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "has no recorded model" in done.stderr and "Traceback" not in done.stderr


def test_round_metrics_read_runs_recorded_before_federated_evaluation():
    old = {"round": 1, "eval_loss": 0.3, "eval_accuracy": 0.9, "train_metrics": {"train_loss": 1}}
    assert round_metrics(old) == {"central.loss": 0.3, "central.accuracy": 0.9, "train.loss": 1}


@pytest.mark.slow
def test_cross_site_evaluation_scores_every_model_at_every_site(hospitals, tmp_path):
    root, _, _ = hospitals
    db = f"sqlite:///{tmp_path / 'h.db'}"
    done = simulate_hospitals(
        root, tmp_path, "--rounds", "2", "--no-secure-agg", "--cross-site",
        "--fraction-evaluate", "0.5", "--select-metric", "auc",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with open_store(db) as store:
        rounds = store.rounds(store.list_runs()[0].run_id)
    assert "cross_site" not in rounds[0]["extra"]["evaluation"]
    matrix = rounds[-1]["extra"]["evaluation"]["cross_site"]
    names = ["hospital-a", "hospital-b", "hospital-c"]
    assert sorted((m["model"], m["site"]) for m in matrix) == sorted(
        (model, site) for model in ["global", *names] for site in names
    )  # the final model at every site (not half of them), and each site's own model
    assert all(m["status"] == "ok" and "auc" in m["metrics"] for m in matrix), matrix
    shown = fedweave("history", "show", "latest", "--db", db, cwd=tmp_path)
    assert "cross-site evaluation: auc" in shown.stdout


def test_cross_site_evaluation_under_secagg_scores_the_global_model_at_every_site(
    hospitals, tmp_path
):
    root, _, _ = hospitals
    db = f"sqlite:///{tmp_path / 'h.db'}"
    done = simulate_hospitals(
        root, tmp_path, "--rounds", "1", "--cross-site", "--fraction-evaluate", "0.4",
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    with open_store(db) as store:
        (row,) = store.rounds(store.list_runs()[0].run_id)
    matrix = row["extra"]["evaluation"]["cross_site"]
    # no site's own model (SecAgg+ never shows one), the global one at every site, even
    # though --fraction-evaluate alone would have sampled one
    assert sorted((m["model"], m["site"]) for m in matrix) == [
        ("global", name) for name in ["hospital-a", "hospital-b", "hospital-c"]
    ]
    assert all(m["status"] == "ok" and "auc" in m["metrics"] for m in matrix), matrix


def test_a_sites_reported_metrics_are_bounded_and_cannot_pose_as_the_coordinators_tag():
    from fedweave.contract import CROSS_SITE_MODEL_KEY, MAX_SITE_METRICS, bounded_site_metrics
    from fedweave.coordinator.rounds.reporting import weighted_train_metrics

    sent = {
        CROSS_SITE_MODEL_KEY: "123",  # a forged cross-site entry
        "auc": 0.9, "fw-site-name": "a" * 1000, "bad name\n": 1.0, "nested": {"x": 1},
        **{f"m{i}": float(i) for i in range(500)},
    }  # fmt: skip
    kept = bounded_site_metrics(sent)
    assert CROSS_SITE_MODEL_KEY not in kept and "bad name\n" not in kept and "nested" not in kept
    assert kept["auc"] == 0.9 and len(kept["fw-site-name"]) == 255
    assert len(kept) == MAX_SITE_METRICS
    # one site's text where the others send numbers does not break the round's mean
    results = [
        (None, _Res(0.0, 10, {"train_loss": 1.0})),
        (None, _Res(0.0, 10, {"train_loss": "x"})),
    ]
    assert weighted_train_metrics(results) == {"train_loss": 0.5}  # type: ignore[arg-type]
    # how many processes a site says it trained in is its own row's, never the round's mean
    for claim in (float("nan"), 1e300, -3.0, "many", 2.0):
        results = [
            (None, _Res(0.0, 10, {"train_loss": 1.0, "processes": claim})),
            (None, _Res(0.0, 10, {"train_loss": 0.0})),
        ]
        assert weighted_train_metrics(results) == {"train_loss": 0.5}  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_private_evaluation_records_only_the_sum_and_it_matches_the_per_site_one(
    hospitals, tmp_path
):
    """The same seeded run twice under SecAgg+: once with per-site evaluation figures, once
    with --private-evaluation. The global models are the same, so the private run's unmasked
    example-weighted means must equal the per-site run's up to SecAgg+'s quantization (under
    3 sites x 3.8e-6 x 10000 / ~60 evaluation examples = 2e-3), while it records no site's
    own figure."""
    root, _, _ = hospitals
    means = {}
    for label, extra in (("open", ()), ("private", ("--private-evaluation",))):
        db = f"sqlite:///{tmp_path / f'{label}.db'}"
        done = simulate_hospitals(root, tmp_path, "--rounds", "2", "--db", db, *extra)
        assert done.returncode == 0, done.stderr[-3000:]
        with open_store(db) as store:
            rows = store.rounds(store.list_runs()[0].run_id)
        means[label] = [row["extra"]["evaluation"]["federated"] for row in rows]
        if label == "private":
            assert "private: only their sum through SecAgg+" in done.stderr
            for row in rows:
                sites = row["extra"]["evaluation"]["sites"]
                assert sorted(s["site"] for s in sites) == [
                    "hospital-a", "hospital-b", "hospital-c"
                ]  # fmt: skip
                assert all(s["status"] == "ok" and s["examples"] > 0 for s in sites), sites
                assert all(not (set(s.get("metrics") or {}) & {"loss", "auc", "accuracy"})
                           for s in sites), sites  # fmt: skip
    for open_round, private_round in zip(means["open"], means["private"], strict=True):
        assert set(private_round) == {"loss", "accuracy", "auc"}
        for name, value in private_round.items():
            assert value == pytest.approx(open_round[name], abs=2e-3), (name, means)


def test_private_evaluation_refuses_what_it_cannot_keep_private(hospitals, tmp_path):
    root, _, _ = hospitals
    for extra, said in (
        (("--no-secure-agg",), "drop --no-secure-agg"),
        (("--cross-site",), "--cross-site records each site's figures"),
        (("--evaluate-every", "0"), "--evaluate-every"),
        (("--fraction-evaluate", "0.5"), "fewer than the 3 a private evaluation sums over"),
    ):
        done = simulate_hospitals(root, tmp_path, "--private-evaluation", *extra, timeout=120)
        assert done.returncode == 2 and said in done.stderr, (extra, done.stderr[-1000:])
        assert "Traceback" not in done.stderr


def test_the_site_console_says_the_word_the_coordinator_records(caplog):
    """One word for one event: a refused evaluation is 'refused' on the site's console, as
    in the coordinator's record; any other error is 'failed'."""
    from fedweave.client.mods import _said_if_it_fails
    from fedweave.contract import SiteRefusal

    def refuse(msg, context):
        raise SiteRefusal("this site holds no evaluation data")

    def crash(msg, context):
        raise RuntimeError("disk gone")

    with caplog.at_level("WARNING", logger="fedweave.site.console"):
        for call_next in (refuse, crash):
            with pytest.raises((SiteRefusal, RuntimeError)):
                _said_if_it_fails(None, None, call_next, "round 2: evaluation {status}: ")
    assert [r.getMessage() for r in caplog.records] == [
        "round 2: evaluation refused: this site holds no evaluation data",
        "round 2: evaluation failed: disk gone",
    ]
