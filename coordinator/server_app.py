"""The Flower ServerApp: the chosen strategy over the sampled sites, SecAgg+ by default,
central evaluation, round reports.

Built on Flower's legacy strategy API (``LegacyContext`` + ``DefaultWorkflow``) because
SecAgg+ (``SecAggPlusWorkflow``) only plugs into that API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.workflow import DefaultWorkflow

from fedweave.contract import (
    BATCH_SIZE_KEY,
    LOCAL_EPOCHS_KEY,
    LR_KEY,
    MAX_NORM_KEY,
    ROUND_KEY,
    SECAGG_CLIP_KEY,
    SECAGG_MAX_WEIGHT_KEY,
    SEED_KEY,
)
from fedweave.coordinator.privacy import DpSettings, local_dp_config, wrap_for_central_dp
from fedweave.coordinator.rounds import RoundListener
from fedweave.coordinator.secure_agg import SecAggSettings, derive_shares, make_secagg_workflow
from fedweave.coordinator.strategies import check_strategy_choice, make_strategy
from fedweave.learning.task import ArrayData, load_task
from fedweave.learning.training import TrainConfig, seed_everything
from fedweave.learning.weights import get_weights, set_weights


@dataclass(frozen=True)
class ServerSettings:
    """What the coordinator runs.

    Attributes:
        task: task name or ``module:attr``.
        rounds: rounds to run in this process (after a resume: the remaining ones).
        min_clients: sites that must be connected before round 1 (all sites in simulation).
        clients_per_round: sites sampled each round (default: all ``min_clients``).
        local_epochs / lr / batch_size: sent to every site each round.
        seed: seeds the initial model and each site's shuffling.
        device: where central evaluation runs (``None``: CUDA when present).
        round_offset: rounds already completed before this process (resume).
        strategy: ``fedavg`` (default), ``fedprox``, ``fedadam``, ``fedyogi``, ``fedmedian``,
            ``trimmedavg``, ``krum`` or ``multikrum``.
        secure_agg: SecAgg+ on (default): the coordinator only ever sees the sum.
        secagg: SecAgg+ parameters (see ``fedweave.coordinator.secure_agg``).
        max_update_norm: reject updates farther than this from the global model (L2).
        dp: differential privacy (see ``fedweave.coordinator.privacy``; default off).
    """

    task: str
    rounds: int
    min_clients: int
    clients_per_round: int | None = None
    local_epochs: int = 1
    lr: float = 0.1
    batch_size: int = 16
    seed: int = 0
    device: str | None = None
    round_offset: int = 0
    strategy: str = "fedavg"
    secure_agg: bool = True
    secagg: SecAggSettings = field(default_factory=SecAggSettings)
    max_update_norm: float | None = None
    dp: DpSettings = field(default_factory=DpSettings)

    @property
    def cohort(self) -> int:
        return self.clients_per_round or self.min_clients

    def check(self) -> None:
        """Refuse impossible combinations before anything starts (one-line UserErrors)."""
        check_strategy_choice(self.strategy, self.secure_agg)
        self.dp.check()
        if self.secure_agg:
            derive_shares(self.cohort)

    def fit_config(self, server_round: int) -> dict[str, int | float]:
        """What every sampled site is told for ``server_round`` (Flower's numbering)."""
        config: dict[str, int | float] = {
            ROUND_KEY: server_round + self.round_offset,
            LOCAL_EPOCHS_KEY: self.local_epochs,
            LR_KEY: self.lr,
            BATCH_SIZE_KEY: self.batch_size,
            SEED_KEY: self.seed,
        }
        if self.max_update_norm is not None:
            config[MAX_NORM_KEY] = self.max_update_norm
        if self.secure_agg:
            config[SECAGG_CLIP_KEY] = self.secagg.clipping_range
            config[SECAGG_MAX_WEIGHT_KEY] = self.secagg.max_weight
        config.update(local_dp_config(self.dp))
        return config


def initial_weights(task_spec: str, seed: int) -> list[np.ndarray]:
    """The global model before round 1: the task's model built under ``seed``."""
    seed_everything(seed)
    return get_weights(load_task(task_spec).build_model())


def make_central_evaluator(task_spec: str, test_data: ArrayData, device: str | None):
    """Score weights on the held-out test set with the task's own evaluate()."""
    task = load_task(task_spec)
    model = task.build_model()
    config = TrainConfig(device=device)

    def evaluate(weights: list[np.ndarray]) -> dict[str, float]:
        set_weights(model, weights)
        return task.evaluate(model, test_data, config)

    return evaluate


def make_server_app(
    settings: ServerSettings,
    test_data: ArrayData,
    start_weights: list[np.ndarray],
    listeners: Sequence[RoundListener] = (),
) -> ServerApp:
    """A ServerApp that runs ``settings.rounds`` rounds from ``start_weights``."""
    settings.check()
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = make_strategy(
            settings.strategy,
            settings.secure_agg,
            evaluator=make_central_evaluator(settings.task, test_data, settings.device),
            listeners=listeners,
            round_offset=settings.round_offset,
            max_update_norm=settings.max_update_norm,
            fraction_fit=settings.cohort / settings.min_clients,
            min_fit_clients=settings.cohort,
            min_available_clients=settings.min_clients,
            fraction_evaluate=0.0,
            min_evaluate_clients=0,
            initial_parameters=ndarrays_to_parameters(start_weights),
            on_fit_config_fn=settings.fit_config,
        )
        strategy = wrap_for_central_dp(strategy, settings.dp, settings.secure_agg, settings.cohort)
        legacy = LegacyContext(
            context=context,
            config=ServerConfig(num_rounds=settings.rounds),
            strategy=strategy,
        )
        fit_workflow = (
            make_secagg_workflow(settings.secagg, settings.cohort) if settings.secure_agg else None
        )
        DefaultWorkflow(fit_workflow=fit_workflow)(grid, legacy)

    return app
