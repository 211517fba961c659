"""The Flower ServerApp: FedAvg over the sampled sites, central evaluation, round reports.

Built on Flower's legacy strategy API (``LegacyContext`` + ``DefaultWorkflow``) because
SecAgg+ (``SecAggPlusWorkflow``) only plugs into that API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.workflow import DefaultWorkflow

from client.task import ArrayData, load_task
from client.training import TrainConfig, evaluate_model, seed_everything
from client.weights import get_weights, set_weights
from coordinator.rounds import RoundListener
from coordinator.strategies import ReportingFedAvg


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
    """A ServerApp that runs ``settings.rounds`` FedAvg rounds from ``start_weights``."""
    per_round = settings.clients_per_round or settings.min_clients

    def fit_config(server_round: int) -> dict[str, int | float]:
        return {
            "round": server_round + settings.round_offset,
            "local_epochs": settings.local_epochs,
            "lr": settings.lr,
            "batch_size": settings.batch_size,
            "seed": settings.seed,
        }

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = ReportingFedAvg(
            evaluator=make_central_evaluator(settings.task, test_data, settings.device),
            listeners=listeners,
            round_offset=settings.round_offset,
            fraction_fit=per_round / settings.min_clients,
            min_fit_clients=per_round,
            min_available_clients=settings.min_clients,
            initial_parameters=ndarrays_to_parameters(start_weights),
            on_fit_config_fn=fit_config,
        )
        legacy = LegacyContext(
            context=context,
            config=ServerConfig(num_rounds=settings.rounds),
            strategy=strategy,
        )
        DefaultWorkflow()(grid, legacy)

    return app
