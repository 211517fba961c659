"""``digits``: scikit-learn's 1,797 real 8x8 handwritten digits, a small MLP."""

from __future__ import annotations

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
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = (bunch.data / 16.0).astype(np.float32)
        return held_out_split(x, bunch.target, test_fraction=0.2)
