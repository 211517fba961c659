"""``digits``: scikit-learn's 1,797 real 8x8 handwritten digits, a small MLP."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedweave.learning.task import ArrayData
from fedweave.learning.tasks.classification import ClassificationTask, held_out_split

if TYPE_CHECKING:
    from torch import nn


class DigitsTask(ClassificationTask):
    """Digits 0-9 from ``sklearn.datasets.load_digits``; 20% held out as the test set.

    Args:
        hidden: width of the hidden layers (default 64 gives ~9k parameters; the SecAgg+
            benchmark uses a wider model through this knob).
    """

    name = "digits"
    input_shape = (64,)
    num_classes = 10

    def __init__(self, hidden: int = 64) -> None:
        self.hidden = hidden

    def build_model(self) -> nn.Module:
        from torch import nn

        return nn.Sequential(
            nn.Linear(64, self.hidden),
            nn.ReLU(),
            nn.Linear(self.hidden, self.hidden),
            nn.ReLU(),
            nn.Linear(self.hidden, 10),
        )

    def load_data(self) -> tuple[ArrayData, ArrayData]:
        pixels, labels = digits_arrays()
        x = (pixels / 16.0).astype(np.float32)
        return held_out_split(x, labels, test_fraction=0.2)


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """``load_digits().data`` and ``.target``: 1,797 rows of 64 pixels (0-16) and their digits.

    Read from the CSV scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``, as
    ``load_digits`` reads it) without importing ``sklearn.datasets``, an import of ~2.3 s of
    CPU in every process that loads the task (a simulation's driver and its Ray workers,
    ``fedweave data split``: 2.6 s of CPU, 0.5 s without it). Where the file is not there,
    ``load_digits`` itself; ``tests/test_tasks.py`` checks that both give the same arrays.
    """
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as rows:
                table = np.loadtxt(rows, delimiter=",")
            return table[:, :-1], table[:, -1].astype(int)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data, bunch.target
