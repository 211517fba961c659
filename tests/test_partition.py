"""Partitioners: deterministic, complete, and Dirichlet skew grows as alpha falls."""

import numpy as np
import pytest

from fedweave.errors import UserError
from fedweave.learning.tasks import load_task
from fedweave.simulations.partition import label_skew, partition_indices


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    train, _ = load_task("digits").load_data()
    return train.y


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_same_seed_same_split_and_every_example_once(labels, scheme):
    first = partition_indices(labels, 10, scheme, alpha=0.5, seed=3)
    second = partition_indices(labels, 10, scheme, alpha=0.5, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    together = np.concatenate(first)
    assert len(together) == len(np.unique(together)) == len(labels)


def test_different_seed_different_split(labels):
    a = partition_indices(labels, 10, "dirichlet", alpha=0.5, seed=0)
    b = partition_indices(labels, 10, "dirichlet", alpha=0.5, seed=1)
    assert any(len(x) != len(y) or not np.array_equal(x, y) for x, y in zip(a, b))


def test_dirichlet_skew_grows_as_alpha_falls(labels):
    skews = [
        label_skew(labels, partition_indices(labels, 10, "dirichlet", alpha=alpha, seed=0))
        for alpha in (100.0, 1.0, 0.1)
    ]
    assert skews[0] < skews[1] < skews[2]
    assert skews[0] < 0.1 and skews[2] > 0.5


def test_shards_hold_few_classes(labels):
    parts = partition_indices(labels, 10, "shards", shards_per_client=2, seed=0)
    assert all(len(np.unique(labels[p])) <= 2 for p in parts)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"scheme": "dirichlet", "alpha": 0.0}, "--alpha must be > 0"),
        ({"scheme": "nope"}, "unknown partition"),
        ({"num_clients": 100_000}, "more than the"),
        ({"num_clients": 0}, "at least 1"),
    ],
)
def test_bad_arguments_are_user_errors(labels, kwargs, message):
    args = {"num_clients": 10, "scheme": "iid"} | kwargs
    with pytest.raises(UserError, match=message):
        partition_indices(labels, **args)
