"""The model, data and local loop of fedweave's ``digits`` task, written out with plain torch."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

HIDDEN = 64
EPOCHS, BATCH_SIZE, LR, MOMENTUM = 1, 16, 0.1, 0.9


def build_model(hidden: int = HIDDEN) -> nn.Module:
    """The same MLP as ``fedweave.learning.tasks.digits.DigitsTask(hidden)`` (64-64-64-10 by
    default; ``bench/large_model_task.py``'s wider ones with the run config's ``hidden``)."""
    return nn.Sequential(
        nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )  # fmt: skip


def load(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A split file written by ``fedweave data split``: arrays ``x`` and ``y``."""
    with np.load(path) as arrays:
        return torch.from_numpy(arrays["x"]).float(), torch.from_numpy(arrays["y"]).long()


def get_weights(model: nn.Module) -> list[np.ndarray]:
    return [value.detach().cpu().numpy() for value in model.state_dict().values()]


def set_weights(model: nn.Module, weights: list[np.ndarray]) -> None:
    keys = model.state_dict().keys()
    model.load_state_dict({k: torch.from_numpy(np.asarray(w)) for k, w in zip(keys, weights)})


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """``EPOCHS`` of SGD with momentum over shuffled batches."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(EPOCHS):
        for batch in torch.randperm(len(x)).split(BATCH_SIZE):
            optimizer.zero_grad()
            loss_fn(model(x[batch]), y[batch]).backward()
            optimizer.step()


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Mean cross-entropy and accuracy."""
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = float(nn.functional.cross_entropy(logits, y))
        return loss, float((logits.argmax(dim=1) == y).float().mean())
