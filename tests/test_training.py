"""Local training: seeded and repeatable on CPU, device choice, and the mixed-precision path."""

import numpy as np
import pytest
import torch

from fedweave.errors import UserError
from fedweave.learning.tasks import load_task
from fedweave.learning.training import TrainConfig, pick_device, seed_everything
from fedweave.learning.weights import (
    get_weights,
    load_weights_npz,
    save_weights_npz,
    weights_sha256,
)


def train_once(config: TrainConfig):
    task = load_task("digits")
    train, test = task.load_data()
    seed_everything(0)
    model = task.build_model()
    metrics = task.train(model, train, config)
    return get_weights(model), metrics, task.evaluate(model, test, config)


def test_same_seed_same_weights_on_cpu():
    a, _, _ = train_once(TrainConfig(epochs=1, seed=5, device="cpu"))
    b, _, _ = train_once(TrainConfig(epochs=1, seed=5, device="cpu"))
    c, _, _ = train_once(TrainConfig(epochs=1, seed=6, device="cpu"))
    assert weights_sha256(a) == weights_sha256(b)
    assert weights_sha256(a) != weights_sha256(c)


def test_training_learns_digits():
    _, metrics, scores = train_once(TrainConfig(epochs=5, device="cpu"))
    assert metrics["num_examples"] == 1438
    assert scores["accuracy"] > 0.85


def test_mixed_precision_path_runs_on_cpu():
    """The autocast + loss-scaler code that CUDA uses, forced on CPU (bfloat16)."""
    _, metrics, scores = train_once(TrainConfig(epochs=2, device="cpu", amp=True))
    assert np.isfinite(metrics["train_loss"])
    assert scores["accuracy"] > 0.7


def test_device_choice():
    assert pick_device("cpu").type == "cpu"
    assert pick_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(UserError, match="unknown device"):
        pick_device("tpu9")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_requested_without_gpu_is_a_user_error():
    with pytest.raises(UserError, match="no CUDA GPU"):
        pick_device("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_training_with_amp_and_pinned_batches():
    weights, metrics, scores = train_once(TrainConfig(epochs=3, device="cuda"))
    assert scores["accuracy"] > 0.85 and np.isfinite(metrics["train_loss"])
    assert all(isinstance(w, np.ndarray) for w in weights)


def test_checkpoint_files_round_trip_and_detect_tampering(tmp_path):
    weights, _, _ = train_once(TrainConfig(epochs=1, device="cpu"))
    sha, size = save_weights_npz(tmp_path / "m.npz", weights)
    assert size == (tmp_path / "m.npz").stat().st_size
    loaded = load_weights_npz(tmp_path / "m.npz", expected_sha256=sha)
    assert weights_sha256(loaded) == weights_sha256(weights)
    (tmp_path / "m.npz").write_bytes((tmp_path / "m.npz").read_bytes()[:-3] + b"xyz")
    with pytest.raises(ValueError, match="sha256"):
        load_weights_npz(tmp_path / "m.npz", expected_sha256=sha)
