"""Tables by schema: read by column name, every bad value refused with file, line and column,
federated statistics equal to the pooled ones, and the objectives' metrics."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fedweave.errors import UserError
from fedweave.learning.column_map import read_column_map
from fedweave.learning.objectives import Binary, MultiLabel, Regression
from fedweave.learning.statistics import local_only_statistics
from fedweave.learning.tables import Categorical, Label, Numeric
from fedweave.learning.tasks import load_task
from fedweave.learning.tasks.tabular import TabularTask

TASK = TabularTask(
    name="clinic",
    features=[Numeric("age"), Numeric("chol", impute=True), Categorical("sex", ("F", "M"))],
    label=Label("disease", kind="binary", classes=("no", "yes")),
)
GOOD = "age,chol,sex,disease\n50,200.5,F,no\n61,,M,yes\n45,180,M,no\n"


def write(tmp_path, text, name="site.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_columns_are_read_by_name_in_any_order_and_extra_ones_ignored(tmp_path, caplog):
    plain = TASK.read_site_data(write(tmp_path, GOOD))
    shuffled = pd.read_csv(write(tmp_path, GOOD, "a.csv"))[["disease", "sex", "chol", "age"]]
    shuffled.insert(0, "patient_id", ["p1", "p2", "p3"])
    shuffled.to_csv(tmp_path / "b.csv", index=False)
    with caplog.at_level("WARNING", logger="fedweave.data"):
        reordered = TASK.read_site_data(tmp_path / "b.csv")
    assert np.array_equal(plain.numeric, reordered.numeric, equal_nan=True)
    assert np.array_equal(plain.categorical, reordered.categorical)
    assert list(reordered.labels) == [0, 1, 0]
    assert "patient_id" in caplog.text and caplog.text.count("ignoring") == 1
    stats = local_only_statistics(TASK, plain)
    encoded = TASK.prepare(plain, stats)
    # age standardised, chol's missing value → the mean (0), sex one-hot
    assert encoded.x.shape == (3, 4)
    assert encoded.x[1, 1] == 0.0 and list(encoded.x[:, 2]) == [1.0, 0.0, 0.0]
    assert abs(encoded.x[:, 0].mean()) < 1e-6 and encoded.x[:, 0].std() == pytest.approx(1, 1e-5)


def test_parquet_reads_like_csv(tmp_path):
    frame = pd.read_csv(write(tmp_path, GOOD))
    frame.to_parquet(tmp_path / "site.parquet")
    table = TASK.read_site_data(tmp_path / "site.parquet")
    assert list(table.labels) == [0, 1, 0] and np.isnan(table.numeric[1, 1])


@pytest.mark.parametrize(
    "text, message",
    [
        ("age,sex,disease\n50,F,no\n", "no column 'chol'"),
        ("agee,chol,sex,disease\n50,1,F,no\n", "no column 'age'"),
        ("age,chol,sex,disease\n50,1,F,no\n,2,M,yes\n", "line 3, column 'age': missing value"),
        ("age,chol,sex,disease\nn/a,1,F,no\n", "line 2, column 'age': missing value (n/a)"),
        ("age,chol,sex,disease\n1,1,F,no\nnan,1,F,no\n", "line 3, column 'age': missing value"),
        ("age,chol,sex,disease\ninf,1,F,no\n", "line 2, column 'age': missing value (inf)"),
        ("age,chol,sex,disease\nold,1,F,no\n", "line 2, column 'age': 'old' is not a number"),
        ("age,chol,sex,disease\n50,1,F,maybe\n", "line 2, column 'disease': 'maybe' is not one"),
        ("age,chol,sex,disease\n50,1,X,no\n", "line 2, column 'sex': 'X' is not one"),
        ("age,chol,sex,disease\n", "header but no rows"),
        ("", "the file is empty"),
    ],
)
def test_bad_tables_are_refused_naming_file_line_and_column(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as info:
        TASK.read_site_data(path)
    assert message in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_a_sites_own_headers_map_to_the_tasks_columns_by_declared_aliases(tmp_path):
    """A clinic whose file says ``BMI`` where the task says ``bmi``: an alias maps it (not
    pinned: the schema and its digest stay the same); without one the error says the two
    differ only in case; a file with both headers of one column is refused."""
    plain = TabularTask("c", [Numeric("bmi"), Numeric("age")], Label("y", "regression"))
    aliased = TabularTask("c", [Numeric("bmi", aliases=("BMI", "body mass")), Numeric("age")],
                          Label("y", "regression", aliases=("Y",)))  # fmt: skip
    assert aliased.schema.digest() == plain.schema.digest()
    site = write(tmp_path, "age,BMI,Y\n50,31.5,120\n61,22.0,80\n")
    table = aliased.read_site_data(site)
    assert np.allclose(table.numeric, [[31.5, 50], [22.0, 61]]) and list(table.labels) == [120, 80]
    with pytest.raises(UserError) as info:
        plain.read_site_data(site)
    assert (
        "'BMI' differs from 'bmi' only in case: rename it, map it (--columns map.toml: "
        "'BMI' = 'bmi'), or declare aliases=('BMI',) on the task's column 'bmi'"
    ) in str(info.value)
    both = write(tmp_path, "age,bmi,body mass,y\n50,31.5,31.5,1\n", "both.csv")
    with pytest.raises(UserError, match="columns 'bmi' and 'body mass' both stand for the"):
        aliased.read_site_data(both)
    with pytest.raises(ValueError, match="header 'age' stands for both column 'bmi' and"):
        TabularTask("c", [Numeric("bmi", aliases=("age",)), Numeric("age")], Label("y"))


MAPPED = TabularTask("c", [Numeric("bmi"), Numeric("age", aliases=("Age",))],
                     Label("progression", "regression"))  # fmt: skip


def column_map(tmp_path, text, name="map.toml"):
    return str(write(tmp_path, text, name))


def test_a_sites_column_map_renames_its_headers_to_the_tasks_columns(tmp_path):
    """``--columns map.toml``: a file that says ``BMI`` and ``Disease progression`` reads as
    the task's spelling does, without editing the file or the task (before the aliases);
    scoring new data, a mapped label header may be absent."""
    from fedweave.learning.data import load_site_data

    spelt = MAPPED.read_site_data(write(tmp_path, "bmi,age,progression\n31.5,50,120\n22,61,80\n"))
    site = write(tmp_path, "Age,BMI,Disease progression\n50,31.5,120\n61,22,80\n", "own.csv")
    mapping = column_map(
        tmp_path, '[columns]\nBMI = "bmi"\n"Disease progression" = "progression"\n'
    )
    mapped = load_site_data(site, MAPPED, None, mapping)
    assert np.array_equal(mapped.numeric, spelt.numeric) and list(mapped.labels) == [120, 80]
    unlabelled = write(tmp_path, "Age,BMI\n50,31.5\n", "new.csv")
    new = MAPPED.read_new_data(unlabelled, columns=read_column_map(mapping))
    assert np.array_equal(new.numeric, [[31.5, 50]])


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "map.toml does not exist; pass --columns with a .toml file"),
        ('[columns]\nBMI = "bmi"\nage 50\n', "map.toml is not valid TOML (Expected '=' after a "
         "key in a key/value pair (at line 3, column 5)); fix the file"),
        ('BMI = "bmi"\n', "map.toml has no [columns] table; write one line per renamed header"),
        ("[columns]\nBMI = 3\n", "map.toml: 'BMI' maps to 3, not a column name;"),
        ('[columns]\nBMI = "bmi"\nBmi = "bmi"\n',
         "map.toml maps both 'BMI' and 'Bmi' to column 'bmi'; keep one"),
        ("#" * (1024 * 1024 + 1), "map.toml is over 1024 KiB; a map is a few lines"),
    ],
)  # fmt: skip
def test_a_bad_column_map_file_is_one_line_naming_the_fix(tmp_path, text, message):
    path = tmp_path / "map.toml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UserError) as info:
        read_column_map(path)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "header, mapping, message",
    [
        ("BMI,age,progression", 'BMI = "bmii"', "map.toml maps 'BMI' to 'bmii', which is not "
         "one of the task's columns (bmi, age, progression); fix the map"),
        ("bmi,age,progression", 'BMI = "bmi"', "map.toml names 'BMI', which the file has no "
         "column of (the file has: bmi, age, progression); fix the map"),
        ("BMI,bmi,age,progression", 'BMI = "bmi"',
         "columns 'BMI' and 'bmi' both stand for the task's column 'bmi'; keep one of them"),
        ("bmi,years,Age,progression", 'years = "age"',
         "columns 'years' and 'Age' both stand for the task's column 'age'; keep one of them"),
    ],
)  # fmt: skip
def test_a_column_map_that_does_not_fit_the_file_or_task_is_one_line(
    tmp_path, header, mapping, message
):
    site = write(tmp_path, header + "\n" + ",".join("1" * len(header.split(","))) + "\n")
    columns = read_column_map(column_map(tmp_path, "[columns]\n" + mapping + "\n"))
    with pytest.raises(UserError) as info:
        MAPPED.read_site_data(site, columns=columns)
    assert message in str(info.value) and str(site) in str(info.value)
    assert "\n" not in str(info.value)


def test_a_column_map_is_refused_for_a_task_that_reads_no_tables(tmp_path):
    from fedweave.learning.data import load_site_data

    mapping = column_map(tmp_path, '[columns]\nBMI = "bmi"\n')
    with pytest.raises(UserError, match="^--columns maps a table's headers; task 'digits' does "
                       "not read tables"):  # fmt: skip
        load_site_data(tmp_path / "site.npz", load_task("digits"), None, mapping)


def test_fedweave_client_with_a_bad_column_map_fails_before_connecting(tmp_path):
    """Exit 2, one ``error:`` line, no traceback, nothing connected: a map that is not TOML
    (the site process reads the file) and one naming a header the data lacks (the site's
    worker reads the data with it)."""
    from test_deploy_support import run_fedweave

    site = write(tmp_path, "mean radius,diagnosis\n1.0,0\n")
    base = ("client", "--coordinator", "127.0.0.1:1", "--insecure", "--task", "breast-cancer",
            "--data", str(site), "--columns")  # fmt: skip
    for text, wanted in (
        ("[columns\n", "is not valid TOML"),
        ('[columns]\nRadius = "mean radius"\n', f"{site}: the column map "
         f"{tmp_path / 'bad.toml'} names 'Radius', which the file has no column of"),
    ):  # fmt: skip
        (tmp_path / "bad.toml").write_text(text)
        done = run_fedweave(*base, "bad.toml", cwd=tmp_path)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
        assert wanted in lines[0] and "connecting" not in done.stderr


def test_a_regression_label_must_be_numeric(tmp_path):
    task = TabularTask("cost", [Numeric("age")], Label("cost", kind="regression"))
    path = write(tmp_path, "age,cost\n50,100.5\n60,high\n")
    with pytest.raises(UserError, match="line 3, column 'cost': 'high' is not a number"):
        task.read_site_data(path)


def test_breast_cancer_columns_are_scikit_learns():
    """The task spells out the table's column names (importing ``sklearn.datasets`` costs every
    site process ~2 s); they must be scikit-learn's, in its order."""
    from sklearn.datasets import load_breast_cancer

    from fedweave.learning.tasks.breast_cancer import feature_names

    assert feature_names() == [str(name) for name in load_breast_cancer().feature_names]
    assert [f.name for f in load_task("breast-cancer").schema.features] == feature_names()


def test_declared_bounds_scale_clip_and_pin_and_nothing_else_changes(tmp_path):
    """A DP run scales with the columns' declared bounds (nothing read from a site's data):
    within them to [-1, 1], outside clipped, missing at the midpoint. A task without
    bounds pins the schema it always did (older runs' digests hold)."""
    from fedweave.learning.statistics import declared_statistics, dp_statistics_problem

    bounded = TabularTask(
        "clinic", [Numeric("age", bounds=(0, 120)), Numeric("chol", impute=True, bounds=(100, 300)),
                   Categorical("sex", ("F", "M"))],
        Label("disease", kind="binary", classes=("no", "yes")),
    )  # fmt: skip
    statistics = declared_statistics(bounded)
    assert statistics["means"] == [60.0, 200.0] and statistics["stds"] == [60.0, 100.0]
    table = bounded.read_site_data(write(tmp_path, GOOD + "130,90,F,no\n"))
    x = bounded.prepare(table, statistics).x
    expected_age = [-1 / 6, 1 / 60, -0.25, 1.0]  # 50, 61, 45, 130 clipped to 120
    assert np.allclose(x[:, 0], expected_age) and np.allclose(x[:, 1], [0.005, 0.0, -0.2, -1.0])
    assert declared_statistics(TASK) is None and dp_statistics_problem(bounded, "b") is None
    assert "(age, chol)" in dp_statistics_problem(TASK, "clinic")
    assert TASK.schema.pinned()["features"][0] == {"name": "age", "kind": "numeric",
                                                   "impute": False}  # fmt: skip
    assert bounded.schema.pinned()["features"][0]["bounds"] == [0.0, 120.0]
    assert bounded.schema.digest() != TASK.schema.digest()
    for bad in [(1, 1), (2, 1), (0, float("inf")), ("a", 1), (1,)]:
        with pytest.raises(ValueError, match="column 'x': bounds must be"):
            Numeric("x", bounds=bad)


def test_sites_statistics_combine_to_the_pooled_ones():
    """Each site's vector is a mean over its examples; their example-weighted mean (what
    SecAgg+ returns) gives the pooled means and standard deviations."""
    task = load_task("breast-cancer")
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer().data
    parts = np.array_split(data, [300, 450])
    tables = [
        type("T", (), {"numeric": p, "labels": np.zeros(len(p), dtype=np.int64),
                       "__len__": lambda self, n=len(p): n})()
        for p in parts
    ]  # fmt: skip
    known: dict = {}
    for stage in task.statistics_stages:
        vectors = [task.local_statistics(t, stage, known) for t in tables]
        weights = np.array([len(t) for t in tables]) / len(data)
        mean = sum(w * v for w, v in zip(weights, vectors))
        known.update(task.add_statistics(stage, mean, known))
    assert np.allclose(known["means"], data.mean(axis=0), rtol=1e-9)
    assert np.allclose(known["stds"], data.std(axis=0), rtol=1e-6)
    # the scales are powers of two near each feature's magnitude
    assert all(np.log2(s) == round(np.log2(s)) for s in known["scales"])


def test_a_regression_labels_statistics_combine_to_the_pooled_ones():
    """A regression label rides with the features: its pooled mean and standard deviation
    from the sites' weighted vectors, the label ~100x the features' magnitude."""
    rng = np.random.default_rng(3)
    task = TabularTask("cost", [Numeric("age"), Numeric("chol")], Label("cost", "regression"))
    numeric = rng.normal([50, 200], [10, 30], size=(400, 2))
    labels = (numeric @ [3.0, 1.5] + rng.normal(0, 40, 400)).astype(np.float32)
    parts = [(numeric[a:b], labels[a:b]) for a, b in ((0, 60), (60, 250), (250, 400))]
    tables = [
        type("T", (), {"numeric": x, "labels": y, "__len__": lambda self, n=len(y): n})()
        for x, y in parts
    ]  # fmt: skip
    known: dict = {}
    for stage in task.statistics_stages:
        vectors = [task.local_statistics(t, stage, known) for t in tables]
        assert all(len(v) == task.statistics_size(stage, known) for v in vectors)
        mean = sum(len(t) / 400 * v for t, v in zip(tables, vectors))
        known.update(task.add_statistics(stage, mean, known))
    assert known["label_mean"] == pytest.approx(labels.mean(dtype=np.float64), rel=1e-6)
    assert known["label_std"] == pytest.approx(labels.std(dtype=np.float64), rel=1e-5)
    assert np.allclose(known["means"], numeric.mean(axis=0), rtol=1e-9)


def test_a_scaled_regression_learns_the_standardised_label_and_scores_in_its_units():
    from fedweave.learning.task import ArrayData
    from fedweave.learning.training import for_data

    rng = np.random.default_rng(2)
    targets = torch.tensor(rng.normal(300, 80, size=64), dtype=torch.float32)
    outputs = (targets - 300) / 80 + torch.tensor(rng.normal(0, 0.1, size=64), dtype=torch.float32)
    data = ArrayData(np.zeros((64, 1), np.float32), targets.numpy(), (300.0, 80.0))
    objective = for_data(Regression(), data)
    assert objective.label_mean == 300.0 and objective.label_std == 80.0
    assert for_data(Regression(), data.subset(np.arange(5))) == objective
    assert for_data(Regression(), ArrayData(data.x, data.y)) == Regression()
    scorer = objective.scorer()
    scorer.add(outputs, targets)
    result = scorer.result()
    error = outputs.numpy() * 80 + 300 - targets.numpy()
    assert result["rmse"] == pytest.approx(float(np.sqrt(np.mean(error**2))), rel=1e-5)
    assert result["mae"] == pytest.approx(float(np.mean(np.abs(error))), rel=1e-5)
    assert result["loss"] == pytest.approx(float(np.mean((error / 80) ** 2)), rel=1e-5)
    assert float(objective.loss(outputs, targets)) == pytest.approx(result["loss"], rel=1e-5)


def test_binary_metrics_match_scikit_learn():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(size=200), dtype=torch.float32)
    labels = torch.tensor(rng.integers(0, 2, size=200), dtype=torch.float32)
    scorer = Binary().scorer()
    scorer.add(logits[:120], labels[:120])
    scorer.add(logits[120:], labels[120:])
    result = scorer.result()
    assert result["auc"] == pytest.approx(roc_auc_score(labels.numpy(), logits.numpy()))
    right = ((logits > 0).float() == labels).float()
    assert result["accuracy"] == pytest.approx(float(right.mean()))


def test_regression_and_multilabel_metrics():
    from sklearn.metrics import f1_score, mean_absolute_error

    rng = np.random.default_rng(1)
    outputs, targets = rng.normal(size=50), rng.normal(size=50)
    scorer = Regression().scorer()
    scorer.add(torch.tensor(outputs), torch.tensor(targets))
    result = scorer.result()
    assert result["mae"] == pytest.approx(mean_absolute_error(targets, outputs))
    assert result["rmse"] == pytest.approx(np.sqrt(np.mean((outputs - targets) ** 2)))
    logits = rng.normal(size=(40, 3))
    truth = rng.integers(0, 2, size=(40, 3)).astype(np.float32)
    scorer = MultiLabel().scorer()
    scorer.add(torch.tensor(logits), torch.tensor(truth))
    expected = f1_score(truth, (logits > 0).astype(int), average="micro")
    assert scorer.result()["f1"] == pytest.approx(expected)


def test_a_site_refuses_statistics_or_a_schema_it_cannot_use(tmp_path):
    from fedweave.client.site_app import TaskClient
    from fedweave.contract import (
        SECAGG_CLIP_KEY,
        SECAGG_MAX_WEIGHT_KEY,
        STATISTICS_KEY,
        STATISTICS_STAGE_KEY,
        SiteRefusal,
    )
    from fedweave.learning.statistics import encode_known
    from fedweave.learning.training import TrainConfig
    from fedweave.learning.weights import get_weights

    table = TASK.read_site_data(write(tmp_path, GOOD))
    client = TaskClient(TASK, table, TrainConfig.for_task(TASK, device="cpu"), 0)
    weights = get_weights(client.model)
    # each is the site refusing the run's message, with its reason (a coded outcome reply)
    with pytest.raises(SiteRefusal, match="standardises with federated statistics but the run"):
        client.fit(weights, {})
    other = {**local_only_statistics(TASK, table), "schema": "000000000000"}
    with pytest.raises(SiteRefusal, match=r"schema \(\w+\) differs from the run's"):
        client.fit(weights, {STATISTICS_KEY: encode_known(other)})
    good = local_only_statistics(TASK, table)
    _, n, metrics = client.fit(weights, {STATISTICS_KEY: encode_known(good)})
    assert n == 3 and np.isfinite(metrics["train_loss"])
    # a statistics vector SecAgg+ would clip is refused, not sent clipped
    stage = {STATISTICS_STAGE_KEY: "scale", SECAGG_CLIP_KEY: 1e-6, SECAGG_MAX_WEIGHT_KEY: 10.0}
    with pytest.raises(SiteRefusal, match="would be clipped"):
        client.fit([np.zeros(2, dtype=np.float32)], stage)


def test_the_coordinator_checks_each_sites_statistics():
    """A site's statistics vector of the wrong length, or not finite, is recorded as a failure
    and left out of the mean, instead of breaking or poisoning every site's scaling."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    from fedweave.coordinator.rounds.federated_statistics import StatisticsStrategy

    class Proxy:
        def __init__(self, node_id: int) -> None:
            self.node_id = node_id

    def reply(vector, n):
        return FitRes(Status(Code.OK, ""), ndarrays_to_parameters([np.asarray(vector)]), n, {})

    strategy = StatisticsStrategy("moments", 3, 4, {})
    strategy.aggregate_fit(
        0,
        [(Proxy(1), reply([1.0, 2.0, 3.0], 10)), (Proxy(2), reply([3.0, 4.0, 5.0], 30)),
         (Proxy(3), reply([1.0, 2.0], 50)), (Proxy(4), reply([np.nan, 0.0, 0.0], 50)),
         (Proxy(5), reply([1e300, 0.0, 0.0], 50))],
        [],
    )  # fmt: skip
    assert np.allclose(strategy.mean, [2.5, 3.5, 4.5])
    assert strategy.failures == [
        "site 3: statistics of the wrong shape", "site 4: statistics not finite",
        "site 5: statistics beyond ±1.84e+19, which no mean of a site's scaled values reaches",
    ]  # fmt: skip
    # a pooled scale vector pushed past [-1, 1] (by a weight, say) cannot overflow the powers
    # of two (it raised OverflowError and ended the run)
    task = load_task("breast-cancer")
    scales = task.add_statistics("scale", np.full(30, 3.0e17), {})["scales"]
    assert scales == [2.0**64] * 30
