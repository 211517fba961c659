"""What a peer trains: a task's torch model on local data (``build_learner``), or a fixed
vector.

The peer loop only sees named NumPy arrays, so the same loop gossips a torch model or a
synthetic vector; the vector learner is how the tests and protocol benchmarks check exact
average preservation (``tests/vector_peer.py`` hands it to a real peer; no product option
does).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fedweave.errors import UserError

log = logging.getLogger("fedweave.gossip")


class Learner(Protocol):
    """The local side of a peer: weights in and out, train, evaluate."""

    num_examples: int

    def weights(self) -> OrderedDict[str, np.ndarray]:
        """Current weights as fresh arrays (the caller may send them zero-copy)."""

    def load(self, weights: OrderedDict[str, np.ndarray]) -> None:
        """Replace the local weights (copying: received arrays are read-only frame views)."""

    def train(self, round_: int) -> dict[str, float]:
        """One round of local training; returns its metrics."""

    def evaluate(self) -> dict[str, float] | None:
        """Loss/accuracy on held-out data, or ``None`` without test data."""


class TaskLearner:
    """A ``Task``'s model trained on this site's data with ``fedweave.learning.training``.

    Every peer seeds the model init with the same ``seed`` so all start from one model, as in
    FedAvg; shuffling is seeded per peer and round so sites do not step in lockstep.
    ``processes``: train each round across processes (``--nproc-per-node``; ``None``: in
    this one), the data prepared with ``statistics`` (the peer's own, encoded); a round whose
    ranks fail keeps the model it started from and says why, and the peer gossips on.
    """

    def __init__(
        self,
        task: Any,
        data: Any,
        test: Any | None,
        train_config: Any,
        peer_id: str,
        initial_model: Path | None = None,
        task_name: str = "",
        processes: Any | None = None,
        statistics: str | None = None,
    ) -> None:
        import torch

        self.task, self.data, self.test, self.config = task, data, test, train_config
        self.processes, self.statistics = processes, statistics
        torch.manual_seed(train_config.seed)
        self.model = task.build_model()
        self.start = ""
        """The sha256 of the initial model loaded (``initial_model``), ``""`` for none."""
        adapted_base = getattr(task, "base_sha256", None)
        if adapted_base is not None:  # --peft lora: the base is already in the model
            self.start = adapted_base
        elif initial_model is not None:
            from fedweave.learning.initial_model import load_initial_model

            self.start = load_initial_model(self.model, initial_model, task_name)
        self.num_examples = len(data)
        self._warm_up()
        self._peer_salt = int(hashlib.sha256(peer_id.encode()).hexdigest()[:6], 16)

    def _warm_up(self) -> None:
        """Train a throw-away copy on a few examples once: torch's first step is slow (lazy
        initialisation), and paying it before joining keeps round 1 comparable to the rest."""
        import copy

        if len(self.data) == 0:
            return
        small = self.data.subset(np.arange(min(len(self.data), self.config.batch_size)))
        self.task.train(copy.deepcopy(self.model), small, self.config)

    def weights(self) -> OrderedDict[str, np.ndarray]:
        from fedweave.learning.weights import get_named_weights

        return get_named_weights(self.model)

    def load(self, weights: OrderedDict[str, np.ndarray]) -> None:
        import torch

        state = OrderedDict(
            (k, torch.from_numpy(np.array(v, copy=True))) for k, v in weights.items()
        )
        self.model.load_state_dict(state, strict=True)

    def train(self, round_: int) -> dict[str, float]:
        seed = self.config.seed * 1_000_003 + self._peer_salt * 1009 + round_
        config = dataclasses.replace(self.config, seed=seed % (2**31))
        if self.processes is None:
            return self.task.train(self.model, self.data, config)
        from fedweave.learning.site_processes import SiteProcessesFailed, train_across_processes

        try:
            return train_across_processes(self.processes, self.model, config, self.statistics)
        except SiteProcessesFailed as exc:
            log.warning("round %d: training failed (%s); gossiping the model it started from",
                        round_, exc)  # fmt: skip
            return {}

    def evaluate(self) -> dict[str, float] | None:
        if self.test is None:
            return None
        return self.task.evaluate(self.model, self.test, self.config)


class VectorLearner:
    """A single float vector that is never trained: gossip alone must average it.

    Args:
        vector: the initial value (float64 keeps the averaging error far below tolerance).
        num_examples: the weight of this peer in the example-weighted average (default 1).
    """

    def __init__(self, vector: np.ndarray, num_examples: int = 1) -> None:
        self._x = np.array(vector, dtype=np.float64).ravel()
        self.num_examples = num_examples

    def weights(self) -> OrderedDict[str, np.ndarray]:
        return OrderedDict(x=self._x.copy())

    def load(self, weights: OrderedDict[str, np.ndarray]) -> None:
        self._x = np.array(weights["x"], dtype=np.float64, copy=True)

    def train(self, round_: int) -> dict[str, float]:
        return {}

    def evaluate(self) -> dict[str, float] | None:
        return None


def build_learner(config: Any, peer_id: str) -> Learner:
    """The learner a peer's config asks for: its task on its local data."""
    from fedweave.learning.adapters import run_task
    from fedweave.learning.data import load_site_data
    from fedweave.learning.personal import refuse_in_gossip
    from fedweave.learning.statistics import (
        encode_known,
        local_only_statistics,
        needs_statistics,
    )
    from fedweave.learning.tasks import load_task
    from fedweave.learning.training import TrainConfig

    refuse_in_gossip(config.data.task)
    task = load_task(config.data.task)
    if config.data.data is None:
        raise UserError("a peer needs its local data: pass --data site.npz (or .csv)")
    trained = run_task(config)  # --peft lora: adapters on the --initial-model
    data = load_site_data(Path(config.data.data), task, config.data.label_column)
    test_path = config.data.test_data
    test = (  # a CSV test file names its labels like the peer's own file
        load_site_data(Path(test_path), task, config.data.label_column)
        if test_path is not None
        else None
    )
    processes = _processes(config, task)
    statistics = None
    if needs_statistics(task):
        # No coordinator to gather federated statistics: a peer standardises with its own.
        own = local_only_statistics(task, data)
        statistics = encode_known(own)
        data = task.prepare(data, own)  # type: ignore[attr-defined]
        test = task.prepare(test, own) if test is not None else None  # type: ignore[attr-defined]
    train = TrainConfig.of(config.training, task)
    initial = config.training.initial_model
    return TaskLearner(
        trained, data, test, train, peer_id, initial, config.data.task, processes, statistics
    )


def _processes(config: Any, task: Any) -> Any | None:
    """How the peer trains across processes (``--nproc-per-node``), None for one; the
    problem in one line when it cannot."""
    nproc = config.training.nproc_per_node
    if nproc == 1:
        return None
    from fedweave.learning.site_processes import SiteData, SiteProcesses, check_processes

    check_processes(nproc, config.training.device, task)
    if config.training.peft != "none":
        raise UserError(
            f"--nproc-per-node {nproc} with --peft {config.training.peft} is not supported "
            "yet (the ranks would train the task without its adapters); use --nproc-per-node 1"
        )
    data = SiteData(config.data.task, str(Path(config.data.data).resolve()),
                    config.data.label_column, eval_fraction=0.0)  # fmt: skip
    return SiteProcesses(nproc, data, config.training.device)
