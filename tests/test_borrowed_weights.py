"""The coordinator's central evaluation scores the round's global model where it lies (issue 36):
its model holds no copy of the weights between evaluations, and reads them, without a copy,
while it scores them (``fedweave.learning.weights.borrowed_weights``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from fedweave.coordinator.rounds.central_evaluation import make_central_evaluator
from fedweave.learning.data import central_test_data
from fedweave.learning.tasks import load_task
from fedweave.learning.training import TrainConfig
from fedweave.learning.weights import borrowed_weights, get_weights, release_weights, set_weights


def _read_only(weights: list[np.ndarray]) -> list[np.ndarray]:
    """Views of bytes, as a message's arrays are."""
    return [np.frombuffer(w.tobytes(), dtype=w.dtype).reshape(w.shape) for w in weights]


class _WithBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(4)  # persistent buffers, an int64 one among them
        self.linear = nn.Linear(4, 2)
        self.register_buffer("offset", torch.full((4,), 0.5), persistent=False)

    def forward(self, x):
        return self.linear(self.norm(x + self.offset))


def test_a_borrowed_model_reads_the_arrays_in_place_and_holds_nothing_after():
    torch.manual_seed(0)
    model = _WithBuffers()
    model.norm.running_mean.add_(1.0)
    weights = _read_only(get_weights(model))
    reference = _WithBuffers()
    set_weights(reference, [w.copy() for w in weights])
    reference.eval()
    release_weights(model)
    assert all(t.is_meta for t in model.state_dict().values())
    x = torch.randn(5, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "not writable" warning is not shown
        with borrowed_weights(model, weights):
            for tensor, array in zip(model.state_dict().values(), weights):
                assert tensor.data_ptr() == array.ctypes.data  # the array's memory, no copy
            model.eval()
            assert torch.equal(model(x), reference(x))
    assert all(t.is_meta for t in model.state_dict().values())
    assert torch.equal(model.offset, torch.full((4,), 0.5))  # non-persistent: kept
    with pytest.raises(ValueError, match="model has 7 tensors but 6 were given"):
        with borrowed_weights(model, weights[:-1]):
            pass


def test_central_evaluation_scores_each_global_model_as_a_model_holding_it_would():
    task = load_task("digits")
    data = central_test_data(task, None)  # the task's own test split
    evaluate = make_central_evaluator(task, data, "cpu")
    config = TrainConfig(device="cpu")
    for seed in (1, 2):  # a second model: nothing of the first is left in the evaluator
        torch.manual_seed(seed)
        holder = task.build_model()
        weights = _read_only(get_weights(holder))
        assert evaluate(weights) == task.evaluate(holder, data, config)
