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


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(6, 4)
        self.out = nn.Linear(4, 6, bias=False)
        self.out.weight = self.embed.weight  # one tensor, two names

    def forward(self, x):
        return self.out(self.embed(x))


def test_a_site_takes_over_the_decoded_arrays_and_reads_its_model_out_without_a_copy():
    """A site's model (``adopt_weights``) takes over the memory of the arrays Flower decoded
    for it, converting only what it must (read-only, another dtype), and what it reads out
    without a copy (``weights_view``) keeps its values through the next load and the
    training after it. Tied weights stay tied (copied into); a wrong shape is refused."""
    from fedweave.learning.data import ArrayData
    from fedweave.learning.training import train_epochs
    from fedweave.learning.weights import adopt_weights, adopts_weights, weights_view

    torch.manual_seed(1)
    model = _WithBuffers()
    arrays = get_weights(model)  # fresh, writable, the model's dtypes (0-d int64 among them)
    for array in arrays:
        array += 1
    adopt_weights(model, arrays)
    pointers = [t.data_ptr() for t in model.state_dict().values()]
    assert pointers == [a.ctypes.data for a in arrays]  # no copy
    assert all(torch.equal(t, torch.from_numpy(a)) for t, a in
               zip(model.state_dict().values(), arrays))  # fmt: skip

    trained = weights_view(model)
    kept = [w.copy() for w in trained]
    assert [w.ctypes.data for w in trained] == pointers
    others = _read_only([w * 2 for w in get_weights(model)])
    others[0] = others[0].astype(np.float64)  # another dtype: converted
    adopt_weights(model, others)
    assert all(t.data_ptr() not in pointers for t in model.state_dict().values())
    assert model.state_dict()["norm.weight"].dtype == torch.float32
    data = ArrayData(np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32),
                     np.arange(16) % 2)  # fmt: skip
    train_epochs(model, data, TrainConfig(epochs=1, batch_size=4, lr=0.5))
    assert all(np.array_equal(a, b) for a, b in zip(trained, kept))  # untouched by both
    assert all(p.grad is None for p in model.parameters())  # the last gradients let go

    tied = _Tied()
    assert not adopts_weights(tied)
    adopt_weights(tied, [w + 1 for w in get_weights(tied)])
    assert tied.out.weight is tied.embed.weight
    with pytest.raises(ValueError, match="size mismatch"):
        adopt_weights(model, [np.zeros((3, 3), np.float32)] + get_weights(model)[1:])
