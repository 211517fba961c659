"""Digits tasks with one misbehaving site, for fault-injection tests.

One training example carries a sentinel value; whichever site holds it after the split
misbehaves (raises, sends NaN, a wrong shape, a wrong dtype, or huge noise). With an iid
split exactly one site holds it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedweave.learning.tasks.digits import DigitsTask

SENTINEL = 7.0  # digits features are in [0, 1]


class _OneBadSite(DigitsTask):
    def load_data(self):
        train, test = super().load_data()
        x = train.x.copy()
        x[0, 0] = SENTINEL
        return type(train)(x, train.y), test

    def is_bad(self, data) -> bool:
        return bool((data.x == SENTINEL).any())

    def misbehave(self, model: nn.Sequential) -> None:
        raise NotImplementedError

    def train(self, model, data, config):
        metrics = super().train(model, data, config)
        if self.is_bad(data):
            self.misbehave(model)
        return metrics


class RaisingDigits(_OneBadSite):
    name = "digits-raising"

    def misbehave(self, model):
        raise RuntimeError("injected fault: this site crashes while training")


class NanDigits(_OneBadSite):
    name = "digits-nan"

    def misbehave(self, model):
        with torch.no_grad():
            model[0].weight.fill_(float("nan"))


class WrongShapeDigits(_OneBadSite):
    name = "digits-wrong-shape"

    def misbehave(self, model):
        model[4] = nn.Linear(self.hidden, 11)


class WrongDtypeDigits(_OneBadSite):
    name = "digits-wrong-dtype"

    def misbehave(self, model):
        model[0].weight.data = model[0].weight.data.double()


class NoisyDigits(_OneBadSite):
    name = "digits-noisy"

    def misbehave(self, model):
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 50.0)


def bad_site_index(split_dir) -> int:
    """Which site file holds the sentinel example."""
    for index in range(1000):
        path = split_dir / f"site-{index}.npz"
        if not path.exists():
            break
        if (np.load(path)["x"] == SENTINEL).any():
            return index
    raise LookupError("no site holds the sentinel")
