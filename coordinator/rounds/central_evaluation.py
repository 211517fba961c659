"""Central evaluation: the coordinator scores each new global model on its own held-out data
(``--test-data`` or the task's own test split), when it has any. Both round loops use it
(``round_app.py``'s synchronous rounds, ``fedbuff.py``'s model steps).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedweave.coordinator.rounds.federated_statistics import (
    StatisticsSink,
)
from fedweave.learning.statistics import digest, prepared
from fedweave.learning.training import TrainConfig
from fedweave.learning.weights import borrowed_weights, release_weights


def make_central_evaluator(
    task: Any, test_data: Any, device: str | None, sink: StatisticsSink | None = None
):
    """Score weights on the held-out test set with ``task``'s own evaluate() (the run's task,
    ``adapters.run_task``; prepared with the run's federated statistics once ``sink`` holds
    them); ``None`` without test data, or when the task keeps local layers at the sites (the
    coordinator has no site's own layers: the sites' evaluations score the run)."""
    from fedweave.learning.personal import PersonalTask

    if test_data is None or isinstance(task, PersonalTask):
        return None
    model = task.build_model()
    release_weights(model)  # it stores no weights between evaluations
    config = TrainConfig(device=device)
    cache: dict[str, Any] = {}

    def evaluate(weights: list[np.ndarray]) -> dict[str, float]:
        """The scores of ``weights``, which the caller keeps (the round's global model): the
        model reads them where they are, so the coordinator holds no second copy of them."""
        statistics = sink.statistics if sink is not None else None
        key = digest(statistics) if statistics else ""
        if key not in cache:
            cache.clear()
            cache[key] = prepared(task, test_data, statistics)
        with borrowed_weights(model, weights):
            return task.evaluate(model, cache[key], config)

    return evaluate
