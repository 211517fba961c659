"""Sample-level differential privacy at a site (``--dp sample``): DP-SGD through Opacus.

Each example's gradient is clipped to ``max_grad_norm`` and Gaussian noise of std
``noise_multiplier * max_grad_norm`` is added to every step's sum (Opacus's
``PrivacyEngine``, Poisson sampling of each batch), so the guarantee covers one example (one
patient's row) of the site's data, whatever the coordinator does with the update.

The noise and the Poisson batch masks are fresh and secret: both come from
``fedweave.privacy.noise.SecureRandom`` (a key from the operating system's CSPRNG that only
this site holds), never from the run's seed, which the coordinator chooses and knows. A
coordinator that could replay a site's DP-SGD from the seed, on its data with and without one
example, would tell that example's membership bit for bit. So a seeded ``--dp sample`` run
does not repeat bit for bit (a seeded run without DP does).

The site keeps its own ledger (``SiteLedger``): Opacus's RDP accountant history, every
``(noise multiplier, sample rate, steps)`` this site's data went through, in one JSON file,
across rounds, runs and restarts: the epsilon it reports with every reply is what its data
has spent in total, by its own account, not by the coordinator's word.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

from fedweave.contract import SAMPLE_DP_EPSILON_METRIC
from fedweave.errors import UserError
from fedweave.learning.objectives import Objective
from fedweave.learning.task import ArrayData
from fedweave.learning.training import TrainConfig, make_optimizer, pick_device
from fedweave.privacy.noise import SecureRandom
from fedweave.private_files import write_private_text

DELTA_METRIC = "dp_delta"


@dataclass(frozen=True)
class SampleDp:
    """DP-SGD's parameters, as the coordinator sends them each round.

    Attributes:
        noise_multiplier: noise std over ``max_grad_norm`` per step (> 0).
        max_grad_norm: each example's gradient is clipped to this L2 norm (> 0).
        delta: the delta the site's epsilon is reported at (below 1 / its examples).
    """

    noise_multiplier: float
    max_grad_norm: float
    delta: float


class SiteLedger:
    """This site's privacy ledger: Opacus's RDP history of every DP-SGD step its data went
    through, kept in ``path`` (``None``: in memory only). A file that cannot be read is
    refused, never restarted from zero: that would forget what the data has spent."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.history: list[tuple[float, float, int]] = []
        if path is not None and path.exists():
            try:
                entries = json.loads(path.read_text())["history"]
                self.history = [(float(z), float(q), int(n)) for z, q, n in entries]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise UserError(
                    f"this site's privacy ledger {path} is unreadable ({exc}); restore it "
                    "from a backup (starting it afresh would forget what the data has spent)"
                ) from exc

    def epsilon(self, delta: float, more: list[tuple[float, float, int]] = ()) -> float:
        """Epsilon at ``delta`` after the recorded steps (and ``more`` of them)."""
        from opacus.accountants import RDPAccountant

        history = [*self.history, *more]
        if not history:
            return 0.0
        accountant = RDPAccountant()
        accountant.history = history
        return float(accountant.get_epsilon(delta))

    def record(self, history: list[tuple[float, float, int]]) -> None:
        """Keep ``history`` (the whole of it, after a round) atomically."""
        self.history = [(float(z), float(q), int(n)) for z, q, n in history]
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_private_text(tmp, json.dumps({"history": self.history}) + "\n")
            os.replace(tmp, self.path)
        except OSError as exc:
            raise UserError(
                f"this site cannot write its privacy ledger {self.path} ({exc.strerror}); "
                "give it a writable file: fedweave client --privacy-ledger PATH"
            ) from exc


def round_steps(examples: int, config: TrainConfig) -> tuple[float, int]:
    """(Poisson sample rate, steps) of one round of DP-SGD on ``examples``: Opacus samples
    each example with probability 1 / (batches an epoch), and the round runs its epochs'
    batches (a straggler's share of them)."""
    per_epoch = max(1, math.ceil(examples / config.batch_size))
    steps = max(1, int(config.work_fraction * config.epochs * per_epoch))
    return 1 / per_epoch, steps


def _dataset(data: ArrayData | Dataset) -> Dataset:
    if isinstance(data, ArrayData):
        x = torch.as_tensor(data.x, dtype=torch.float32)
        return TensorDataset(x, torch.as_tensor(data.y))
    return data


def _batches(loader: DataLoader, device: torch.device, target_dtype) -> Iterator[tuple]:
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        if target_dtype is not None and yb.dtype != target_dtype:
            yb = yb.to(target_dtype)
        yield xb, yb


class _SecurePoissonBatches(Sampler[list[int]]):
    """Opacus's Poisson batches (``UniformWithReplacementSampler``: each example in a batch
    with probability ``sample_rate``, ``steps`` batches an epoch), each batch's mask drawn
    from ``source`` instead of torch's generator."""

    def __init__(self, source: SecureRandom, num_samples: int, sample_rate: float, steps: int):
        self.source = source
        self.num_samples = num_samples
        self.sample_rate = sample_rate
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            mask = self.source.poisson_mask(self.num_samples, self.sample_rate)
            yield np.flatnonzero(mask).tolist()


def _batches_from(source: SecureRandom, opacus_loader: DataLoader) -> DataLoader:
    """``opacus_loader`` (the Poisson loader ``make_private`` built, whose sample rate and
    length the accountant counts) with its batches drawn from ``source``: the same dataset,
    rate and batches an epoch, the same empty-batch collation and workers."""
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    opacus_batches = opacus_loader.batch_sampler
    if type(opacus_batches) is not UniformWithReplacementSampler:
        raise RuntimeError(
            f"Opacus's Poisson loader samples with {type(opacus_batches).__name__}, not the "
            "UniformWithReplacementSampler whose masks this site draws from its own source"
        )
    batches = _SecurePoissonBatches(
        source, opacus_batches.num_samples, opacus_batches.sample_rate, opacus_batches.steps
    )
    return DataLoader(
        opacus_loader.dataset, batch_sampler=batches, collate_fn=opacus_loader.collate_fn,
        num_workers=opacus_loader.num_workers, pin_memory=opacus_loader.pin_memory,
        timeout=opacus_loader.timeout, worker_init_fn=opacus_loader.worker_init_fn,
        multiprocessing_context=opacus_loader.multiprocessing_context,
        generator=opacus_loader.generator, prefetch_factor=opacus_loader.prefetch_factor,
        persistent_workers=opacus_loader.persistent_workers,
    )  # fmt: skip


def _noise_from(source: SecureRandom, optimizer) -> None:
    """Make Opacus's ``optimizer`` (a ``DPOptimizer``) add its Gaussian noise, std
    ``noise_multiplier * max_grad_norm`` on each parameter's sum of clipped gradients as its
    own ``add_noise`` does, drawn from ``source`` instead of torch's generator."""
    from opacus.optimizers.optimizer import (
        DPOptimizer,
        _check_processed_flag,
        _mark_as_processed,
    )

    if type(optimizer) is not DPOptimizer:
        raise RuntimeError(
            f"Opacus built a {type(optimizer).__name__}, not the DPOptimizer whose noise this "
            "site draws from its own source"
        )

    def add_noise() -> None:
        std = optimizer.noise_multiplier * optimizer.max_grad_norm
        for p in optimizer.params:
            summed = p.summed_grad
            _check_processed_flag(summed)
            drawn = source.normal(summed.numel(), std)
            noise = torch.from_numpy(drawn).to(device=summed.device, dtype=summed.dtype)
            p.grad = (summed + noise.view_as(summed)).view_as(p)
            _mark_as_processed(summed)

    optimizer.add_noise = add_noise


def train_with_sample_dp(
    model: torch.nn.Module,
    data: ArrayData | Dataset,
    config: TrainConfig,
    objective: Objective,
    dp: SampleDp,
    ledger: SiteLedger,
) -> dict[str, float]:
    """Train ``model`` in place with DP-SGD for ``config.epochs`` epochs (Opacus), record
    the steps in ``ledger``, and return the training metrics with the site's cumulative
    epsilon (``SAMPLE_DP_EPSILON_METRIC``) at ``dp.delta``. FedProx's proximal term and mixed
    precision are not used (the options' rules refuse FedProx; Opacus clips per example)."""
    from opacus import PrivacyEngine

    from fedweave.learning.training import for_data

    objective = for_data(objective, data)
    n = len(data)
    if n == 0:
        raise UserError("this site has no training examples; check its data file")
    device = pick_device(config.device)
    torch.default_generator.manual_seed(config.seed)
    model.to(device)
    model.train()
    # Opacus warns on every call that its secure_mode (torchcsprng) is off: its generators
    # draw nothing here, the noise and the batches come from this site's SecureRandom below
    warnings.filterwarnings("ignore", message="Secure RNG turned off", category=UserWarning)
    warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
    engine = PrivacyEngine(accountant="rdp")
    engine.accountant.history = list(ledger.history)
    loader = DataLoader(
        _dataset(data), batch_size=config.batch_size, shuffle=True,
        generator=torch.Generator().manual_seed(config.seed), num_workers=config.num_workers,
    )  # fmt: skip
    private, optimizer, opacus_loader = engine.make_private(
        module=model, optimizer=make_optimizer(model, config), data_loader=loader,
        noise_multiplier=dp.noise_multiplier, max_grad_norm=dp.max_grad_norm,
        poisson_sampling=True,
    )  # fmt: skip
    secret = SecureRandom()  # this round's, this site's alone: no seed reaches it
    _noise_from(secret, optimizer)
    private_loader = _batches_from(secret, opacus_loader)
    _, steps_left = round_steps(n, config)
    started = time.perf_counter()
    loss_sum, seen = 0.0, 0
    scorer = objective.scorer(full=False)
    try:
        while steps_left > 0:
            loss_sum, seen, scorer = 0.0, 0, objective.scorer(full=False)
            for xb, yb in _batches(private_loader, device, objective.target_dtype):
                if steps_left == 0:
                    break
                steps_left -= 1
                optimizer.zero_grad(set_to_none=True)
                outputs = private(xb)
                # an empty Poisson batch still steps (the noise is the release the accountant
                # counts); its loss, a mean over nothing, is not a figure
                loss = objective.loss(outputs, yb) if len(yb) else outputs.sum() * 0.0
                loss.backward()
                optimizer.step()
                if len(yb):
                    loss_sum += float(loss.detach()) * len(yb)
                    seen += len(yb)
                    scorer.add(outputs.detach().float(), yb)
    finally:
        private.cleanup()  # the module is the site's own again, without Opacus's hooks
    ledger.record(engine.accountant.history)
    train_loss = loss_sum / seen if seen else float("nan")
    metrics = {f"train_{k}": v for k, v in scorer.result().items() if k != "loss"} if seen else {}
    metrics["train_loss"] = train_loss
    if seen and not math.isfinite(train_loss):
        metrics["nonfinite"] = 1.0
    metrics["num_examples"] = float(n)
    metrics["seconds"] = time.perf_counter() - started
    metrics[SAMPLE_DP_EPSILON_METRIC] = ledger.epsilon(dp.delta)
    metrics[DELTA_METRIC] = dp.delta
    return metrics
