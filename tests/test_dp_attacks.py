"""The attack suite: what an adversary who knows a run's seed and sees everything the run
sends can learn under each DP mode, checked by mounting the attack.

Sample-level DP (``--dp sample``, issue 71): the coordinator chooses the seed a site trains
with, so DP-SGD whose noise and Poisson batches came from that seed could be replayed on the
site's data with and without one example, and the replay that matches the site's update bit
for bit would give that example's membership away. The site's noise and batch masks come
from its own secret source (``fedweave.privacy.noise.SecureRandom``), so no replay matches.
The central and local noise attacks (a seeded stream subtracted, a coordinator's understated
settings) are in ``test_dp_noise.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedweave.learning.objectives import MultiClass
from fedweave.learning.sample_dp import SampleDp, SiteLedger, round_steps, train_with_sample_dp
from fedweave.learning.task import ArrayData
from fedweave.learning.training import TrainConfig

_SAMPLE_DP = SampleDp(noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-3)
_SAMPLE_EPSILONS: dict[tuple, float] = {}


class _SampleLedger(SiteLedger):
    """An in-memory ledger that computes each epsilon once (Opacus's RDP sum takes 0.2 s,
    and every trial's round is the same steps)."""

    def __init__(self) -> None:
        super().__init__(None)

    def epsilon(self, delta: float, more: list[tuple[float, float, int]] = ()) -> float:
        key = (tuple(self.history), tuple(more), delta)
        if key not in _SAMPLE_EPSILONS:
            _SAMPLE_EPSILONS[key] = super().epsilon(delta, more)
        return _SAMPLE_EPSILONS[key]


def _sample_data(rng: np.random.Generator, examples: int, features: int, classes: int):
    """A small classification set (``make_classification``-like): Gaussian features, labels
    from a random linear rule."""
    x = rng.normal(size=(examples, features)).astype(np.float32)
    y = np.argmax(x @ rng.normal(size=(features, classes)), axis=1).astype(np.int64)
    return ArrayData(x, y)


def _sample_start(rng: np.random.Generator, features: int, classes: int) -> dict:
    """Starting weights of a ``torch.nn.Linear(features, classes)``, the round's global model."""
    return {
        "weight": torch.from_numpy(rng.normal(0, 0.3, (classes, features)).astype(np.float32)),
        "bias": torch.zeros(classes),
    }


def _sample_train(
    start: dict, data: ArrayData, config: TrainConfig, ledger: SiteLedger | None = None
) -> np.ndarray:
    """One round of DP-SGD at a site from the ``torch.nn.Linear`` weights ``start``: the
    trained weights, flat."""
    classes, features = start["weight"].shape
    model = torch.nn.Linear(features, classes)
    model.load_state_dict(start)
    ledger = _SampleLedger() if ledger is None else ledger
    train_with_sample_dp(model, data, config, MultiClass(), _SAMPLE_DP, ledger)
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().copy()


def test_sample_dp_replay_cannot_tell_membership():
    """A coordinator knows the seed, the starting weights, the config and the data but for
    whether one example is in it; it replays the site's round on D and on D minus that
    example and guesses whichever replay lies closer to the site's real update. Under
    seeded noise and batches that replay was exact (accuracy 1.0); now none is, and the
    guess is near chance."""
    rng = np.random.default_rng(71)
    trials, right = 60, 0
    config = TrainConfig(epochs=1, batch_size=8, lr=0.1, seed=1234, device="cpu")
    for _ in range(trials):
        with_it = _sample_data(rng, 30, 4, 2)
        without_it = ArrayData(with_it.x[1:], with_it.y[1:])
        start = _sample_start(rng, 4, 2)
        member = bool(rng.integers(2))
        site = _sample_train(start, with_it if member else without_it, config)
        replay_in = _sample_train(start, with_it, config)
        replay_out = _sample_train(start, without_it, config)
        assert not np.array_equal(site, replay_in) and not np.array_equal(site, replay_out)
        guess = np.linalg.norm(site - replay_in) < np.linalg.norm(site - replay_out)
        right += guess == member
    assert right / trials <= 0.75, f"membership guessed right {right} times in {trials}"


def test_sample_dp_two_runs_with_one_seed_differ():
    """Two rounds with the same inputs and seed train different weights, and they differ by
    the noise alone, of the stated size: with every example in the one step (a batch as
    large as the data: Poisson rate 1), the clipped sums agree and each weight's difference
    is lr / examples times the difference of two N(0, (multiplier * clip)^2) draws."""
    examples, features, classes = 40, 64, 10
    rng = np.random.default_rng(0)
    data = _sample_data(rng, examples, features, classes)
    config = TrainConfig(epochs=1, batch_size=examples, lr=0.1, seed=7, device="cpu")
    start = _sample_start(rng, features, classes)
    ledger = _SampleLedger()
    first = _sample_train(start, data, config, ledger)
    again = _sample_train(start, data, config)
    assert ledger.history == [(_SAMPLE_DP.noise_multiplier, *round_steps(examples, config))]
    assert np.isfinite(first).all() and np.isfinite(again).all()
    assert not np.array_equal(first, again)
    noise_gap = (first.astype(np.float64) - again) * examples / config.lr
    std = _SAMPLE_DP.noise_multiplier * _SAMPLE_DP.max_grad_norm
    assert noise_gap.std() == pytest.approx(np.sqrt(2) * std, rel=0.15)  # 650 draws: 3% sd
    assert abs(noise_gap.mean()) < 0.3 * std
