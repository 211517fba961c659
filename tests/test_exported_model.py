"""An exported model's preparation (``fedweave/learning/exported_model.py``) turns raw columns
into exactly the inputs ``TabularTask.prepare`` gives: clipped bounds, imputed values,
categories, with and without standardisation; bad rows are one line."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from fedweave.errors import UserError
from fedweave.learning.decoding import decoded
from fedweave.learning.exported_model import prepared_inputs
from fedweave.learning.tables import Categorical, Label, Numeric
from fedweave.learning.tasks.tabular import TabularTask

ROWS = [
    {"age": "71", "chol": "", "sex": "F", "dose": "2.5", "risk": "130.5"},
    {"age": "34", "chol": "210", "sex": "M", "dose": "900", "risk": "80"},
    {"age": "55.5", "chol": "n/a", "sex": "M", "dose": "-3", "risk": "99"},
]
STATISTICS = {"means": [50.0, 200.0, 4.0], "stds": [10.0, 40.0, 2.0],
              "label_mean": 100.0, "label_std": 20.0}  # fmt: skip


def _task(standardise: bool = True) -> TabularTask:
    return TabularTask(
        "clinic",
        [Numeric("age"), Numeric("chol", impute=True), Categorical("sex", ("F", "M")),
         Numeric("dose", bounds=(0, 10))],
        Label("risk", kind="regression"),
        standardise=standardise,
    )  # fmt: skip


def _written(tmp_path) -> str:
    path = tmp_path / "new.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(ROWS[0]))
        writer.writeheader()
        writer.writerows(ROWS)
    return path


@pytest.mark.parametrize("standardise", [True, False])
def test_the_preparation_gives_the_inputs_the_task_prepares(tmp_path, standardise):
    task = _task(standardise)
    path = _written(tmp_path)
    expected = task.prepare(task.read_new_data(path), STATISTICS)
    preparation = task.preparation(STATISTICS)
    with open(path, newline="") as handle:
        inputs = prepared_inputs(preparation, csv.DictReader(handle))
    assert inputs.dtype == np.float32 and inputs.shape == (3, 5)
    np.testing.assert_array_equal(inputs, expected.x)
    outputs = preparation["outputs"]
    assert outputs["kind"] == "regression"
    if standardise:
        assert expected.label_scale == (outputs["label_mean"], outputs["label_std"])
    else:
        assert expected.label_scale is None and outputs["label_std"] == 1.0
    values = decoded(np.array([[0.5], [-1.0]], np.float32), "regression", 100.0, 20.0)
    assert values.tolist() == [110.0, 80.0]


def test_a_bad_row_is_one_line():
    preparation = _task().preparation(STATISTICS)
    columns = {name: [row[name] for row in ROWS] for name in ROWS[0]}
    with pytest.raises(UserError, match="row 1, column 'age': missing value"):
        prepared_inputs(preparation, {**columns, "age": ["", "1", "2"]})
    with pytest.raises(UserError, match="row 2, column 'dose': 'lots' is not a number"):
        prepared_inputs(preparation, {**columns, "dose": ["1", "lots", "2"]})
    with pytest.raises(UserError, match=r"row 3, column 'sex': 'X' is not one of"):
        prepared_inputs(preparation, {**columns, "sex": ["F", "M", "X"]})
    with pytest.raises(UserError, match="no column 'chol'"):
        prepared_inputs(preparation, {k: v for k, v in columns.items() if k != "chol"})
