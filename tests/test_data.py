"""Site data readers: NPZ and CSV load correctly and refuse bad files with clear errors."""

import numpy as np
import pytest

from fedweave.errors import UserError
from fedweave.learning.data import load_site_data, save_site_npz
from fedweave.learning.task import ArrayData
from fedweave.learning.tasks import load_task


@pytest.fixture(scope="module")
def digits():
    return load_task("digits")


def write_csv(path, header, rows):
    path.write_text(",".join(header) + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return path


def test_npz_round_trip(tmp_path, digits):
    train, _ = digits.load_data()
    save_site_npz(tmp_path / "site.npz", train.subset(np.arange(20)))
    data = load_site_data(tmp_path / "site.npz", digits)
    assert data.x.shape == (20, 64) and data.x.dtype == np.float32
    assert np.array_equal(data.y, train.y[:20])


def test_csv_reads_features_and_label_column(tmp_path, digits):
    header = [f"f{i}" for i in range(64)] + ["label"]
    rows = [[0.5] * 64 + [3], [0.25] * 64 + [7]]
    data = load_site_data(write_csv(tmp_path / "s.csv", header, rows), digits, "label")
    assert data.x.shape == (2, 64) and list(data.y) == [3, 7]
    assert data.x[1, 0] == pytest.approx(0.25)


def test_csv_feeds_image_task_as_flat_rows(tmp_path):
    mnist = load_task("mnist5k")
    header = [f"p{i}" for i in range(784)] + ["y"]
    data = load_site_data(write_csv(tmp_path / "m.csv", header, [[0] * 784 + [1]]), mnist, "y")
    assert data.x.shape == (1, 1, 28, 28)


@pytest.mark.parametrize(
    "make, label_column, message",
    [
        (lambda p: p / "absent.npz", None, "does not exist"),
        (lambda p: (p / "a.txt").write_text("x") and p / "a.txt", None, "unsupported data file"),
        (
            lambda p: (p / "bad.npz").write_bytes(b"not a zip") and p / "bad.npz",
            None,
            "not a readable NPZ",
        ),
        (lambda p: np.savez(p / "nox.npz", y=np.zeros(3)) or p / "nox.npz", None, "missing array"),
        (
            lambda p: (
                np.savez(p / "shape.npz", x=np.zeros((3, 10)), y=np.zeros(3)) or p / "shape.npz"
            ),
            None,
            "expects (64,)",
        ),
        (
            lambda p: np.savez(p / "len.npz", x=np.zeros((3, 64)), y=np.zeros(2)) or p / "len.npz",
            None,
            "expected x of shape",
        ),
        (
            lambda p: (
                np.savez(p / "lab.npz", x=np.zeros((2, 64)), y=np.array([0, 12])) or p / "lab.npz"
            ),
            None,
            "labels must be integers 0..9",
        ),
        (lambda p: write_csv(p / "c.csv", ["a", "b"], [[1, 2]]), "label", "no column 'label'"),
        (lambda p: write_csv(p / "c.csv", ["a", "label"], [[1, 2]]), None, "needs --label-column"),
        (
            lambda p: write_csv(
                p / "c.csv", [f"f{i}" for i in range(64)] + ["label"], [["oops"] * 64 + [1]]
            ),
            "label",
            "line 2, column 'f0': 'oops' is not a number",
        ),
        *(
            (
                lambda p, cell=cell: write_csv(
                    p / "c.csv", [f"f{i}" for i in range(64)] + ["label"],
                    [[0.5] * 64 + [1], [0.5] * 5 + [cell] + [0.5] * 58 + [2]],
                ),
                "label",
                "line 3, column 'f5': missing value",
            )
            for cell in ("", "n/a", "nan", "inf", "-inf", "NaN")
        ),
    ],
)
def test_bad_files_give_one_line_errors(tmp_path, digits, make, label_column, message):
    with pytest.raises(UserError) as info:
        load_site_data(make(tmp_path), digits, label_column)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_array_data_subset():
    data = ArrayData(np.arange(10, dtype=np.float32).reshape(5, 2), np.arange(5))
    assert list(data.subset(np.array([4, 0])).y) == [4, 0]
