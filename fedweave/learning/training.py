"""The local train/evaluate loop every site runs: device pick, mixed precision, seeding.

Readable top to bottom on purpose: one config dataclass, one loop for training, one for
evaluation. Batches come from a seeded sampler; on CUDA they are pinned and copied
non-blocking so the copy overlaps compute.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from fedweave.errors import UserError
from fedweave.learning.objectives import MultiClass, Objective
from fedweave.learning.task import ArrayData

if TYPE_CHECKING:
    from fedweave.config.sections import TrainingSection


@dataclass(frozen=True)
class TrainConfig:
    """How a site trains locally.

    Attributes:
        epochs: local epochs per round (default 1).
        batch_size: examples per step (default 16).
        lr: learning rate (default 0.1).
        momentum: SGD momentum (default 0.9).
        optimizer: ``"sgd"`` or ``"adamw"`` (default ``"sgd"``).
        weight_decay: L2 (SGD) or decoupled (AdamW) weight decay (default 0).
        clip_grad_norm: bound on the gradient's L2 norm each step (default ``None``: none).
        num_workers: DataLoader worker processes reading the site's data (default 0: read
            in the training process, right for data already in memory).
        device: ``"cuda"``, ``"cuda:1"``, ``"cpu"`` or ``None`` to pick CUDA when present.
        seed: seeds shuffling and dropout; same seed, same result on CPU (default 0).
        amp: mixed precision; ``None`` (default) means on for CUDA (float16 with loss
            scaling) and off for CPU; ``True`` forces it on CPU too (bfloat16), which is how
            the CUDA code path is exercised on machines without a GPU.
        proximal_mu: FedProx's proximal term weight: ``mu/2 * ||w - w_start||^2`` keeps the
            local model near the round's global model (default 0: plain SGD).
        work_fraction: share of the ``epochs`` × batches steps to run, at least one (a
            simulated straggler's partial work; default 1: all of them).
        rank: this process's place among ``world_size`` processes training one site's share
            together (``fedweave/learning/site_processes.py``; default 0).
        world_size: processes training the site's share together, the model wrapped in
            ``DistributedDataParallel`` (default 1: this process alone). Each takes its
            part of every batch of ``batch_size`` (the global batch), so the update is the
            one a single process would make, within floating-point rounding.
    """

    epochs: int = 1
    batch_size: int = 16
    lr: float = 0.1
    momentum: float = 0.9
    optimizer: str = "sgd"
    weight_decay: float = 0.0
    clip_grad_norm: float | None = None
    num_workers: int = 0
    device: str | None = None
    seed: int = 0
    amp: bool | None = None
    proximal_mu: float = 0.0
    work_fraction: float = 1.0
    rank: int = 0
    world_size: int = 1

    @classmethod
    def of(cls, training: TrainingSection, task: object = None) -> TrainConfig:
        """A site's local work as the run's ``[training]`` settings describe it (the task's
        own momentum, which no flag sets)."""
        from fedweave.learning.task import training_defaults

        return cls(
            epochs=training.local_epochs, batch_size=training.batch_size, lr=training.lr,
            momentum=training_defaults(task).momentum, optimizer=training.optimizer,
            weight_decay=training.weight_decay, clip_grad_norm=training.clip_grad_norm,
            num_workers=training.num_workers, device=training.device, seed=training.seed,
        )  # fmt: skip

    @classmethod
    def for_task(cls, task: object, **values: object) -> TrainConfig:
        """The task's declared training defaults, with ``values`` overriding them."""
        from fedweave.learning.task import training_defaults

        defaults = training_defaults(task)
        base = cls(
            epochs=defaults.local_epochs, batch_size=defaults.batch_size, lr=defaults.lr,
            momentum=defaults.momentum, optimizer=defaults.optimizer,
            weight_decay=defaults.weight_decay, clip_grad_norm=defaults.clip_grad_norm,
        )  # fmt: skip
        return replace(base, **values)  # type: ignore[arg-type]


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


class InMemoryDataset(Dataset):
    """``ArrayData`` as a map-style Dataset that hands the DataLoader whole batches
    (``__getitems__``): one ``index_select`` per batch instead of one item at a time."""

    def __init__(self, data: ArrayData) -> None:
        self.x = torch.from_numpy(np.ascontiguousarray(data.x, dtype=np.float32))
        self.y = torch.from_numpy(np.ascontiguousarray(data.y))

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]

    def __getitems__(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.x.index_select(0, idx), self.y.index_select(0, idx)


def _whole_batch(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return batch


class _IndexBatches(Sampler[torch.Tensor]):
    """Batches of indices as tensors (one ``randperm`` an epoch), so an in-memory dataset's
    ``__getitems__`` selects a batch without a round trip through Python lists.

    With ``world_size`` above 1, this process's part of each batch: the batch split in
    ``world_size`` nearly equal runs, the ``rank``-th taken (``part_size``; a last batch
    with fewer examples than processes leaves some parts empty, and those processes get
    the batch's first example to run through with no weight). Every process draws the same
    order.
    ``as_lists``: indices as Python lists, for any other ``Dataset``.
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        shuffle: bool,
        generator: torch.Generator | None,
        rank: int = 0,
        world_size: int = 1,
        as_lists: bool = False,
    ) -> None:
        self.n, self.batch_size, self.shuffle, self.generator = n, batch_size, shuffle, generator
        self.rank, self.world_size, self.as_lists = rank, world_size, as_lists

    def __iter__(self) -> Iterator[torch.Tensor]:
        order = (
            torch.randperm(self.n, generator=self.generator) if self.shuffle
            else torch.arange(self.n)
        )  # fmt: skip
        batches = order.split(self.batch_size)
        if self.world_size > 1:  # an empty part stands in as the batch's first example
            batches = tuple(
                part if len(part) else batch[:1]
                for batch in batches
                for part in (batch.tensor_split(self.world_size)[self.rank],)
            )
        return iter([b.tolist() for b in batches] if self.as_lists else batches)

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)


def part_size(batch: int, rank: int, world_size: int) -> int:
    """Examples of a batch of ``batch`` that process ``rank`` of ``world_size`` takes (as
    ``Tensor.tensor_split`` divides it)."""
    return batch // world_size + (1 if rank < batch % world_size else 0)


def make_loader(
    data: ArrayData | Dataset,
    batch_size: int,
    device: torch.device,
    shuffle: bool,
    generator: torch.Generator | None = None,
    num_workers: int = 0,
    rank: int = 0,
    world_size: int = 1,
) -> DataLoader:
    """A DataLoader over a site's data: batches streamed from any ``Dataset`` (read by
    ``num_workers`` processes), pinned on CUDA so copies overlap compute; with
    ``world_size`` above 1, this ``rank``'s part of each batch (``_IndexBatches``)."""
    pin = device.type == "cuda"
    if isinstance(data, ArrayData):
        return DataLoader(
            InMemoryDataset(data),
            batch_sampler=_IndexBatches(
                len(data), batch_size, shuffle, generator, rank, world_size
            ),
            num_workers=num_workers,
            pin_memory=pin,
            collate_fn=_whole_batch,
        )
    if world_size > 1:
        return DataLoader(
            data,
            batch_sampler=_IndexBatches(
                len(data), batch_size, shuffle, generator, rank, world_size, as_lists=True
            ),
            num_workers=num_workers,
            pin_memory=pin,
        )
    return DataLoader(
        data,
        batch_size=batch_size,
        shuffle=shuffle,
        generator=generator,
        num_workers=num_workers,
        pin_memory=pin,
    )


def iterate_batches(
    data: ArrayData | Dataset,
    batch_size: int,
    device: torch.device,
    shuffle: bool,
    generator: torch.Generator | None = None,
    num_workers: int = 0,
    target_dtype: torch.dtype | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(x, y)`` batches on ``device`` (non-blocking copies on CUDA), ``y`` as
    ``target_dtype`` when given; this ``rank``'s part of each with ``world_size`` above 1."""
    on_cuda = device.type == "cuda"
    loader = make_loader(
        data, batch_size, device, shuffle, generator, num_workers, rank, world_size
    )
    for xb, yb in loader:
        if xb.device != device:
            xb = xb.to(device, non_blocking=on_cuda)
            yb = yb.to(device, non_blocking=on_cuda)
        if target_dtype is not None and yb.dtype != target_dtype:
            yb = yb.to(target_dtype)
        yield xb, yb


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """SGD with momentum or AdamW over the model's parameters, as ``config`` says."""
    if config.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            model.parameters(), lr=config.lr, momentum=config.momentum,
            weight_decay=config.weight_decay,
        )  # fmt: skip
    raise UserError(f"unknown optimizer '{config.optimizer}': use sgd or adamw")


def for_data(objective: Objective, data: object) -> Objective:
    """``objective`` as it applies to ``data``: a regression whose data carries the label's
    standardisation (``ArrayData.label_scale``) learns and scores the label scaled so."""
    scale = getattr(data, "label_scale", None)
    scaled = getattr(objective, "scaled", None)
    return scaled(*scale) if scale is not None and callable(scaled) else objective


def objective_of(task: object) -> Objective:
    """The task's ``objective``; multi-class cross-entropy when it declares none."""
    declared = getattr(task, "objective", None)
    return declared if isinstance(declared, Objective) else MultiClass()


def use_amp(config: TrainConfig, device: torch.device) -> bool:
    return device.type == "cuda" if config.amp is None else config.amp


def _autocast(device: torch.device) -> torch.autocast:
    dtype = torch.bfloat16 if device.type == "cpu" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def train_epochs(
    model: nn.Module,
    data: ArrayData | Dataset,
    config: TrainConfig,
    objective: Objective | None = None,
) -> dict[str, float]:
    """Train ``model`` in place for ``config.epochs`` epochs on ``data``.

    Returns the last epoch's mean training loss and the objective's metrics over the steps
    it ran (``train_``-prefixed), the number of examples, and the wall time in seconds
    (including the device sync at the end). A loss that turned NaN or infinite is reported
    as ``train_loss`` NaN and ``nonfinite`` 1 (the update's check then rejects it).

    With ``config.world_size`` above 1 (``model`` in ``DistributedDataParallel`` or sharded,
    every process calling this), each process trains on its part of every batch and its loss
    is weighed by that part's share, so the averaged gradient is the whole batch's;
    ``train_loss`` and ``num_examples`` are the site's, the other ``train_`` metrics this
    process's part's.
    """
    objective = for_data(objective or MultiClass(), data)
    n = len(data)
    if n == 0:
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
    optimizer = make_optimizer(model, config)
    # Without mixed precision, no scaler and no autocast at all: creating them costs more on
    # a site's first round than its training does.
    scaler = torch.amp.GradScaler(device.type) if amp else None
    anchor = [p.detach().clone() for p in model.parameters()] if config.proximal_mu > 0 else None
    started = time.perf_counter()
    loss_sum = torch.zeros((), device=device)
    scorer = objective.scorer()
    steps_left = max(1, int(config.work_fraction * config.epochs * -(-n // config.batch_size)))
    seen = 0
    world = config.world_size
    for _ in range(config.epochs):
        if steps_left == 0:
            break
        loss_sum.zero_()
        scorer = objective.scorer(full=False)
        seen = 0
        position = 0  # examples of this epoch's global batches drawn so far
        batches = iterate_batches(
            data, config.batch_size, device, True, generator, config.num_workers,
            objective.target_dtype, config.rank, world,
        )  # fmt: skip
        for xb, yb in batches:
            if steps_left == 0:
                break
            steps_left -= 1
            batch = min(config.batch_size, n - position)
            position += batch
            part = part_size(batch, config.rank, world) if world > 1 else int(yb.shape[0])
            seen += part
            optimizer.zero_grad(set_to_none=True)
            with _autocast(device) if amp else contextlib.nullcontext():
                outputs = model(xb)
                loss = reported = objective.loss(outputs.float() if amp else outputs, yb)
            if world > 1:  # DDP averages over processes: weigh each part as its share
                loss = loss * (part * world / batch) if part else outputs.float().sum() * 0.0
            if anchor is not None:
                drift = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
                loss = loss + 0.5 * config.proximal_mu * drift
                reported = reported + 0.5 * config.proximal_mu * drift
            if scaler is None:
                loss.backward()
                _clip(model, config)
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                if config.clip_grad_norm is not None:
                    scaler.unscale_(optimizer)
                _clip(model, config)
                scaler.step(optimizer)
                scaler.update()
            if part:
                loss_sum += reported.detach().float() * part
                scorer.add(outputs.detach().float(), yb)
    optimizer.zero_grad(set_to_none=True)  # the last step's gradients: a model's worth kept
    if world > 1:  # the site's loss over every process's examples
        import torch.distributed as dist

        totals = torch.tensor([float(loss_sum.item()), float(seen)], dtype=torch.float64)
        dist.all_reduce(totals)
        loss_sum, seen = totals[0], int(totals[1].item())
    train_loss = float(loss_sum.item()) / seen
    metrics = {f"train_{name}": value for name, value in scorer.result().items() if name != "loss"}
    metrics["train_loss"] = train_loss
    if not math.isfinite(train_loss):
        metrics["nonfinite"] = 1.0
    metrics["num_examples"] = float(n)
    metrics["seconds"] = time.perf_counter() - started
    return metrics


def _clip(model: nn.Module, config: TrainConfig) -> None:
    if config.clip_grad_norm is not None:
        nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad_norm)


@torch.no_grad()
def evaluate_model(
    model: nn.Module,
    data: ArrayData | Dataset,
    config: TrainConfig,
    batch_size: int = 512,
    objective: Objective | None = None,
) -> dict[str, float]:
    """The objective's loss and metrics (accuracy for classification) of ``model`` on
    ``data``."""
    objective = for_data(objective or MultiClass(), data)
    if len(data) == 0:
        raise UserError("no evaluation examples; check the test data file")
    device = pick_device(config.device)
    model.to(device)
    model.eval()
    scorer = objective.scorer()
    batches = iterate_batches(
        data, batch_size, device, False, num_workers=config.num_workers,
        target_dtype=objective.target_dtype,
    )  # fmt: skip
    for xb, yb in batches:
        with _autocast(device) if use_amp(config, device) else contextlib.nullcontext():
            outputs = model(xb)
        scorer.add(outputs.float(), yb)
    return scorer.result()
