"""The local train/evaluate loop every site runs: device pick, mixed precision, seeding.

Readable top to bottom on purpose: one config dataclass, one loop for training, one for
evaluation. Batches come from a seeded sampler; on CUDA they are pinned and copied
non-blocking so the copy overlaps compute.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedweave.errors import UserError
from fedweave.learning.task import ArrayData

if TYPE_CHECKING:
    from fedweave.config.sections import TrainingSection


@dataclass(frozen=True)
class TrainConfig:
    """How a site trains locally.

    Attributes:
        epochs: local epochs per round (default 1).
        batch_size: examples per step (default 16).
        lr: SGD learning rate (default 0.1).
        momentum: SGD momentum (default 0.9).
        device: ``"cuda"``, ``"cuda:1"``, ``"cpu"`` or ``None`` to pick CUDA when present.
        seed: seeds shuffling and dropout; same seed, same result on CPU (default 0).
        amp: mixed precision; ``None`` (default) means on for CUDA (float16 with loss
            scaling) and off for CPU; ``True`` forces it on CPU too (bfloat16), which is how
            the CUDA code path is exercised on machines without a GPU.
        proximal_mu: FedProx's proximal term weight: ``mu/2 * ||w - w_start||^2`` keeps the
            local model near the round's global model (default 0: plain SGD).
        work_fraction: share of the ``epochs`` × batches steps to run, at least one (a
            simulated straggler's partial work; default 1: all of them).
    """

    epochs: int = 1
    batch_size: int = 16
    lr: float = 0.1
    momentum: float = 0.9
    device: str | None = None
    seed: int = 0
    amp: bool | None = None
    proximal_mu: float = 0.0
    work_fraction: float = 1.0

    @classmethod
    def of(cls, training: TrainingSection) -> TrainConfig:
        """A site's local work as the run's ``[training]`` settings describe it."""
        return cls(
            epochs=training.local_epochs, batch_size=training.batch_size, lr=training.lr,
            device=training.device, seed=training.seed,
        )  # fmt: skip


def pick_device(requested: str | None = None) -> torch.device:
    """The device to train on: ``requested`` if usable, else CUDA when present, else CPU."""
    if requested is None or requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError as exc:
        raise UserError(f"unknown device '{requested}': use cpu, cuda or cuda:N") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"device '{requested}' requested but no CUDA GPU is visible; use --device cpu"
        )
    return device


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch so a run repeats exactly on CPU."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def iterate_batches(
    data: ArrayData,
    batch_size: int,
    device: torch.device,
    shuffle: bool,
    generator: torch.Generator | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(x, y)`` batches on ``device``; pinned, non-blocking copies on CUDA."""
    x_all = torch.from_numpy(np.ascontiguousarray(data.x, dtype=np.float32))
    y_all = torch.from_numpy(np.ascontiguousarray(data.y, dtype=np.int64))
    n = len(data)
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    on_cuda = device.type == "cuda"
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        xb, yb = x_all.index_select(0, idx), y_all.index_select(0, idx)
        if on_cuda:
            xb, yb = xb.pin_memory(), yb.pin_memory()
        yield xb.to(device, non_blocking=on_cuda), yb.to(device, non_blocking=on_cuda)


def use_amp(config: TrainConfig, device: torch.device) -> bool:
    return device.type == "cuda" if config.amp is None else config.amp


def _autocast(device: torch.device) -> torch.autocast:
    dtype = torch.bfloat16 if device.type == "cpu" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def train_epochs(model: nn.Module, data: ArrayData, config: TrainConfig) -> dict[str, float]:
    """Train ``model`` in place for ``config.epochs`` epochs of SGD on ``data``.

    Returns the mean training loss and accuracy over the last epoch (its steps run, with a
    ``work_fraction`` below 1), the number of examples, and the wall time in seconds
    (including the device sync at the end).
    """
    if len(data) == 0:
        raise UserError("this site has no training examples; check its data file")
    device = pick_device(config.device)
    amp = use_amp(config, device)
    generator = torch.Generator().manual_seed(config.seed)
    # The CPU generator only: torch.manual_seed also seeds every accelerator backend lazily,
    # recording a stack trace each call, which cost more than a small site's training step.
    torch.default_generator.manual_seed(config.seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(config.seed)
    model.to(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    # Without mixed precision, no scaler and no autocast at all: creating them costs more on
    # a site's first round than its training does.
    scaler = torch.amp.GradScaler(device.type) if amp else None
    loss_fn = nn.CrossEntropyLoss()
    anchor = [p.detach().clone() for p in model.parameters()] if config.proximal_mu > 0 else None
    started = time.perf_counter()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    n = len(data)
    steps_left = max(1, int(config.work_fraction * config.epochs * -(-n // config.batch_size)))
    seen = 0
    for _ in range(config.epochs):
        if steps_left == 0:
            break
        loss_sum.zero_()
        correct.zero_()
        seen = 0
        for xb, yb in iterate_batches(data, config.batch_size, device, True, generator):
            if steps_left == 0:
                break
            steps_left -= 1
            seen += int(yb.shape[0])
            optimizer.zero_grad(set_to_none=True)
            with _autocast(device) if amp else contextlib.nullcontext():
                logits = model(xb)
                loss = loss_fn(logits, yb)
            if anchor is not None:
                drift = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
                loss = loss + 0.5 * config.proximal_mu * drift
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            loss_sum += loss.detach().float() * yb.shape[0]
            correct += (logits.detach().argmax(dim=1) == yb).sum()
    metrics = {
        "train_loss": float(loss_sum.item()) / seen,
        "train_accuracy": float(correct.item()) / seen,
        "num_examples": float(n),
        "seconds": time.perf_counter() - started,
    }
    return metrics


@torch.no_grad()
def evaluate_model(
    model: nn.Module, data: ArrayData, config: TrainConfig, batch_size: int = 512
) -> dict[str, float]:
    """Mean cross-entropy loss and accuracy of ``model`` on ``data``."""
    if len(data) == 0:
        raise UserError("no evaluation examples; check the test data file")
    device = pick_device(config.device)
    model.to(device)
    model.eval()
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    for xb, yb in iterate_batches(data, batch_size, device, shuffle=False):
        with _autocast(device) if use_amp(config, device) else contextlib.nullcontext():
            logits = model(xb)
        loss_sum += loss_fn(logits.float(), yb)
        correct += (logits.argmax(dim=1) == yb).sum()
    n = len(data)
    return {"loss": float(loss_sum.item()) / n, "accuracy": float(correct.item()) / n}
