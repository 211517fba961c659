"""Sample-level differential privacy at a site (``--dp sample``): DP-SGD through Opacus.

Each example's gradient is clipped to ``max_grad_norm`` and Gaussian noise of std
``noise_multiplier * max_grad_norm`` is added to every step's sum (Opacus's
``PrivacyEngine``, Poisson sampling of each batch), so the guarantee covers one example (one
patient's row) of the site's data, whatever the coordinator does with the update.

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

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from fedweave.contract import SAMPLE_DP_EPSILON_METRIC
from fedweave.errors import UserError
from fedweave.learning.objectives import Objective
from fedweave.learning.task import ArrayData
from fedweave.learning.training import TrainConfig, make_optimizer, pick_device
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


def delta_problem(delta: float, examples: int) -> str | None:
    """Why ``delta`` guarantees nothing for a site of ``examples`` (``None``: it does)."""
    if delta >= 1 / examples:
        return (
            f"--dp-delta {delta:g} is at least 1 / this site's {examples} examples: a "
            f"guarantee that may fail for one example in {examples} protects none; run "
            f"with --dp-delta below {1 / examples:g}"
        )
    return None


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
    # Opacus warns on every call that its noise comes from torch's generator, not a CSPRNG
    # (its secure_mode needs torchcsprng): docs/privacy.md says so once instead
    warnings.filterwarnings("ignore", message="Secure RNG turned off", category=UserWarning)
    warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
    engine = PrivacyEngine(accountant="rdp")
    engine.accountant.history = list(ledger.history)
    loader = DataLoader(
        _dataset(data), batch_size=config.batch_size, shuffle=True,
        generator=torch.Generator().manual_seed(config.seed), num_workers=config.num_workers,
    )  # fmt: skip
    private, optimizer, private_loader = engine.make_private(
        module=model, optimizer=make_optimizer(model, config), data_loader=loader,
        noise_multiplier=dp.noise_multiplier, max_grad_norm=dp.max_grad_norm,
        poisson_sampling=True, noise_generator=torch.Generator().manual_seed(config.seed + 1),
    )  # fmt: skip
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
