"""Federated statistics before round 1: one exchange per stage with every connected site.

``StatisticsFirst`` wraps the run's fit workflow (plain or SecAgg+): the first time it is
called it runs each of the task's statistics stages through a fresh copy of that workflow,
with ``StatisticsStrategy`` in place of the run's strategy and Flower's round number 0 (so
the sites' stale-round guard still accepts round 1 afterwards), then hands over to the run.
Under SecAgg+ the coordinator learns only the example-weighted mean of the sites' vectors,
as it does for model updates. The result lives in ``StatisticsSink`` and goes to the sites
with every round's config (``STATISTICS_KEY``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from flwr.common import (
    FitIns,
    FitRes,
    Parameters,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import ClientManager

from fedweave.contract import STATISTICS_KEY, STATISTICS_STAGE_KEY
from fedweave.coordinator.rounds.vector_exchange import VectorExchangeStrategy, failure_text
from fedweave.errors import UserError
from fedweave.flower_patches.default_workflow import ClientProxy
from fedweave.learning.statistics import encode_known

log = logging.getLogger("fedweave.statistics")


STATISTICS_LIMIT = 2.0**64
"""The largest value a site's statistics vector may hold, far above any honest mean of scaled
values (under SecAgg+ they are within its clipping range anyway) and far enough below a
float's overflow that squaring a pooled one stays finite: a site that sends more (a rewritten
reply on a run without SecAgg+) is left out of the stage, as one whose vector is not finite."""


class StatisticsSink:
    """Where the gathered statistics are kept for the run (``None`` until gathered)."""

    def __init__(self, statistics: dict[str, Any] | None = None) -> None:
        self.statistics = statistics

    def config(self) -> dict[str, str]:
        """What a round's config carries: the statistics as JSON, once gathered."""
        return {STATISTICS_KEY: encode_known(self.statistics)} if self.statistics else {}


class WithStatistics:
    """Round listeners told the statistics on the first round after they were gathered."""

    def __init__(self, listeners: Sequence[Any], sink: StatisticsSink, told: bool) -> None:
        self.listeners = list(listeners)
        self.sink = sink
        self.told = told  # a resumed run's statistics: recorded already

    def on_round(self, summary: Any) -> None:
        if not self.told and self.sink.statistics is not None:
            summary.statistics = self.sink.statistics
            self.told = True
        for listener in self.listeners:
            listener.on_round(summary)


class StatisticsStrategy(VectorExchangeStrategy):
    """Asks every connected site for one stage's vector and keeps the weighted mean.

    Args:
        stage: the task's stage name.
        size: the vector's length (the sites' replies are checked against it).
        sites: how many sites to ask (all that the run waits for).
        base_config: the rest of the round config (clock, SecAgg+ ranges, known statistics).
    """

    def __init__(self, stage: str, size: int, sites: int, base_config: dict[str, Any]) -> None:
        self.stage = stage
        self.size = size
        self.sites = sites
        self.base_config = base_config
        self.mean: np.ndarray | None = None
        self.failures: list[str] = []

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        clients = client_manager.sample(num_clients=self.sites, min_num_clients=self.sites)
        config = {**self.base_config, STATISTICS_STAGE_KEY: self.stage}
        zeros = ndarrays_to_parameters([np.zeros(self.size, dtype=np.float32)])
        return [(client, FitIns(zeros, config)) for client in clients]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict]:
        self.failures = [failure_text(f) for f in failures]
        usable = []
        for proxy, res in results:  # a site's word is checked, not trusted
            vector = parameters_to_ndarrays(res.parameters)
            if len(vector) != 1 or vector[0].shape != (self.size,):
                self.failures.append(f"site {proxy.node_id}: statistics of the wrong shape")
            elif not np.all(np.isfinite(vector[0])) or res.num_examples < 0:
                self.failures.append(f"site {proxy.node_id}: statistics not finite")
            elif np.max(np.abs(vector[0]), initial=0.0) > STATISTICS_LIMIT:
                self.failures.append(
                    f"site {proxy.node_id}: statistics beyond ±{STATISTICS_LIMIT:.3g}, which no "
                    "mean of a site's scaled values reaches"
                )
            else:
                usable.append((vector[0].astype(np.float64), res.num_examples))
        if not usable:
            return None, {}
        total = sum(n for _, n in usable)
        # Under SecAgg+ every result already carries the same weighted mean.
        weights = [n / total if total else 1 / len(usable) for _, n in usable]
        vectors = [v for v, _ in usable]
        self.mean = sum(w * v for w, v in zip(weights, vectors))
        return None, {}


class StatisticsFirst:
    """A fit workflow that gathers the task's federated statistics before its first round.

    Args:
        fit_workflow: the run's own fit workflow (called for every round after that).
        make_workflow: builds a fresh workflow of the same kind for each statistics stage.
        task: the run's task (``statistics_stages``, ``statistics_size``, ``add_statistics``).
        sites: sites asked (the run's ``min_clients``).
        base_config: a round config without the statistics keys (``fit_config`` of round 0).
        sink: receives the statistics.
    """

    def __init__(
        self,
        fit_workflow: Callable[..., None],
        make_workflow: Callable[[], Callable[..., None]],
        task: Any,
        sites: int,
        base_config: dict[str, Any],
        sink: StatisticsSink,
    ) -> None:
        self.fit_workflow = fit_workflow
        self.make_workflow = make_workflow
        self.task = task
        self.sites = sites
        self.base_config = base_config
        self.sink = sink

    def __call__(self, grid, context) -> None:  # type: ignore[no-untyped-def]
        if self.sink.statistics is None:
            self.sink.statistics = self.gather(grid, context)
        self.fit_workflow(grid, context)

    def gather(self, grid, context) -> dict[str, Any]:  # type: ignore[no-untyped-def]
        from flwr.app import ArrayRecord
        from flwr.server import LegacyContext

        from fedweave.flower_patches.default_workflow import (
            MAIN_CONFIGS_RECORD,
            MAIN_PARAMS_RECORD,
            Key,
        )

        config_record = context.state.config_records[MAIN_CONFIGS_RECORD]
        params_record = context.state.array_records[MAIN_PARAMS_RECORD]
        round_now = config_record[Key.CURRENT_ROUND]
        known: dict[str, Any] = {}
        try:
            for stage in self.task.statistics_stages:
                size = self.task.statistics_size(stage, known)
                strategy = StatisticsStrategy(
                    stage, size, self.sites,
                    {**self.base_config, STATISTICS_KEY: encode_known(known)},
                )  # fmt: skip
                stage_context = LegacyContext(
                    context=context, config=context.config, strategy=strategy,
                    client_manager=context.client_manager,
                )  # fmt: skip
                config_record[Key.CURRENT_ROUND] = 0
                stage_context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord(
                    [np.zeros(size, dtype=np.float32)]
                )
                self.make_workflow()(grid, stage_context)
                if strategy.mean is None:
                    reasons = "; ".join(strategy.failures[:3]) or "no site answered in time"
                    raise UserError(
                        f"the sites' statistics for stage '{stage}' could not be gathered "
                        f"({reasons}); check the sites' data and logs, then start the run again"
                    )
                known.update(self.task.add_statistics(stage, strategy.mean, known))
                log.info("statistics stage %s gathered", stage)
        finally:
            # In place: Flower's DefaultWorkflow keeps this record object and numbers the
            # rounds through it.
            config_record[Key.CURRENT_ROUND] = round_now
            context.state.array_records[MAIN_PARAMS_RECORD] = params_record
        return known
