"""The Flower ClientApp: a NumPyClient that trains the task on this site's data only.

Where the site's data comes from, in order: the SuperNode's ``--node-config data-path=...``
(deployment), an explicit file in the settings, or ``site-<partition-id>.npz`` in a split
directory (simulation).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context

from fedweave.client.mods import SITE_MODS
from fedweave.contract import (
    BATCH_SIZE_KEY,
    DROPS_PARTIAL_WORK_KEY,
    LOCAL_EPOCHS_KEY,
    LR_KEY,
    NODE_DATA_PATH_KEY,
    NODE_PARTITION_KEY,
    PROXIMAL_MU_KEY,
    ROUND_KEY,
    SEED_KEY,
    WORK_FRACTION_KEY,
    late,
    refusal,
)
from fedweave.learning.data import load_site_data
from fedweave.learning.task import ArrayData, Task, load_task
from fedweave.learning.training import TrainConfig
from fedweave.learning.weights import get_weights, set_weights


@dataclass(frozen=True)
class ClientSettings:
    """How a site trains.

    Attributes:
        task: task name or ``module:attr``.
        data_path: this site's data file (deployment).
        split_dir: directory of ``site-<i>.npz`` files (simulation; ``i`` = partition id).
        label_column: label column for CSV data.
        device: ``cuda``/``cpu``/``None`` (auto).
        torch_threads: intra-op threads per client (simulations run several per machine).
    """

    task: str
    data_path: str | None = None
    split_dir: str | None = None
    label_column: str | None = None
    device: str | None = None
    torch_threads: int | None = None


@lru_cache(maxsize=4)
def cached_task(spec: str) -> Task:
    return load_task(spec)


@lru_cache(maxsize=8)
def cached_site_data(path: str, task_spec: str, label_column: str | None) -> ArrayData:
    return load_site_data(path, cached_task(task_spec), label_column)


def resolve_data_path(settings: ClientSettings, context: Context) -> str:
    """Which file this site trains on (see the module docstring for the order)."""
    configured = context.node_config.get(NODE_DATA_PATH_KEY)
    if configured:
        return str(configured)
    if settings.data_path:
        return settings.data_path
    if settings.split_dir is None:
        raise ValueError("no data: give the site a data file (--data)")
    partition = int(context.node_config[NODE_PARTITION_KEY])
    return str(Path(settings.split_dir) / f"site-{partition}.npz")


class TaskClient(NumPyClient):
    """Trains ``task`` on ``data`` starting from the weights the coordinator sends.

    A simulated straggler (``WORK_FRACTION_KEY`` below 1) runs only that share of its local
    steps; when the strategy drops partial work it answers ``late`` instead, as a site still
    training at the deadline would be recorded.
    """

    def __init__(
        self, task: Task, data: ArrayData, config: TrainConfig, site_index: int, node_id: int = 0
    ) -> None:
        self.task = task
        self.data = data
        self.config = config
        self.site_index = site_index
        self.node_id = node_id
        self.model = task.build_model()

    def get_parameters(self, config: dict) -> list[np.ndarray]:
        return get_weights(self.model)

    def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
        work = float(config.get(WORK_FRACTION_KEY, 1.0))
        if work < 1.0 and bool(config.get(DROPS_PARTIAL_WORK_KEY, False)):
            raise RuntimeError(
                late(
                    self.node_id,
                    f"simulated straggler: {100 * work:.0f}% of its local work done by the "
                    "deadline, and the strategy drops partial work",
                )
            )
        self._load_global(parameters)
        round_seed = int(config.get(SEED_KEY, 0)) * 1_000_003 + int(config.get(ROUND_KEY, 0)) * 1009
        train_config = replace(
            self.config,
            epochs=int(config.get(LOCAL_EPOCHS_KEY, self.config.epochs)),
            lr=float(config.get(LR_KEY, self.config.lr)),
            batch_size=int(config.get(BATCH_SIZE_KEY, self.config.batch_size)),
            seed=round_seed + self.site_index,
            proximal_mu=float(config.get(PROXIMAL_MU_KEY, 0.0)),
            work_fraction=work,
        )
        metrics = self.task.train(self.model, self.data, train_config)
        return get_weights(self.model), len(self.data), metrics

    def _load_global(self, parameters: list[np.ndarray]) -> None:
        """The round's global model into this site's; refused when the two models differ."""
        try:
            set_weights(self.model, parameters)
        except (ValueError, RuntimeError) as exc:
            problem = str(exc).strip().splitlines()[-1][:160]
            raise ValueError(
                refusal(
                    f"this site's model for task '{self.task.name}' differs from the "
                    f"coordinator's ({problem}); install the coordinator's fedweave version "
                    "and task code at this site"
                )
            ) from None

    def evaluate(self, parameters: list[np.ndarray], config: dict) -> tuple[float, int, dict]:
        self._load_global(parameters)
        scores = self.task.evaluate(self.model, self.data, self.config)
        return float(scores["loss"]), len(self.data), {"accuracy": float(scores["accuracy"])}


def make_client_app(settings: ClientSettings) -> ClientApp:
    """A ClientApp whose clients train ``settings.task`` on their own data file.

    The site mods (SecAgg+, update check, DP) switch on when the coordinator's round asks.
    """

    def client_fn(context: Context):
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        path = resolve_data_path(settings, context)
        data = cached_site_data(path, settings.task, settings.label_column)
        site_index = int(context.node_config.get(NODE_PARTITION_KEY, 0))
        client = TaskClient(
            cached_task(settings.task), data, TrainConfig(device=settings.device), site_index,
            context.node_id,
        )  # fmt: skip
        return client.to_client()

    return ClientApp(client_fn=client_fn, mods=SITE_MODS)
