"""FedAvg that reports each round to listeners: per-site results, central evaluation, timing."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np
from flwr.common import FitRes, Parameters, Scalar, parameters_to_ndarrays
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from coordinator.rounds import RoundListener, RoundSummary
from fedweave.history.records import SiteResult

CentralEvaluator = Callable[[list[np.ndarray]], dict[str, float]]


def weighted_train_metrics(results: Sequence[tuple[ClientProxy, FitRes]]) -> dict[str, float]:
    """Average the sites' numeric training metrics, weighted by their example counts."""
    total = sum(res.num_examples for _, res in results)
    if total == 0:
        return {}
    keys = {k for _, res in results for k, v in res.metrics.items() if isinstance(v, (int, float))}
    keys.discard("num_examples")
    return {
        key: sum(float(res.metrics.get(key, 0.0)) * res.num_examples for _, res in results) / total
        for key in sorted(keys)
    }


class ReportingFedAvg(FedAvg):
    """Flower's FedAvg plus central evaluation and a per-round report to listeners.

    Args:
        evaluator: scores a list of weights on the held-out set → ``{"loss", "accuracy"}``.
        listeners: told about every completed round (history, progress, report).
        round_offset: added to Flower's round number, so a resumed run continues counting.
        **fedavg_kwargs: passed to ``flwr.server.strategy.FedAvg``.
    """

    def __init__(
        self,
        evaluator: CentralEvaluator,
        listeners: Sequence[RoundListener] = (),
        round_offset: int = 0,
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(fraction_evaluate=0.0, min_evaluate_clients=0, **fedavg_kwargs)
        self.evaluator = evaluator
        self.listeners = list(listeners)
        self.round_offset = round_offset
        self._round_started: tuple[float, datetime] | None = None
        self._sites: list[SiteResult] = []
        self._train_metrics: dict[str, Any] = {}

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list:
        self._round_started = (time.perf_counter(), datetime.now(timezone.utc))
        return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        self._sites = [
            SiteResult(
                site_id=str(proxy.node_id),
                num_examples=int(res.num_examples),
                metrics=dict(res.metrics),
                seconds=float(res.metrics["seconds"]) if "seconds" in res.metrics else None,
            )
            for proxy, res in results
        ]
        for failure in failures:
            if isinstance(failure, BaseException):
                self._sites.append(SiteResult("unknown", status="failed", reason=str(failure)))
            else:
                proxy, res = failure
                self._sites.append(
                    SiteResult(str(proxy.node_id), status="failed", reason=res.status.message)
                )
        self._train_metrics = weighted_train_metrics(results)
        return super().aggregate_fit(server_round, results, failures)

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        if server_round == 0 or self._round_started is None:
            return None  # the initial model is the checkpoint or a fresh init: not worth a pass
        weights = parameters_to_ndarrays(parameters)
        scores = self.evaluator(weights)
        started, started_at = self._round_started
        summary = RoundSummary(
            round=server_round + self.round_offset,
            loss=scores["loss"],
            accuracy=scores["accuracy"],
            seconds=time.perf_counter() - started,
            started_at=started_at,
            ended_at=datetime.now(timezone.utc),
            weights=weights,
            sites=self._sites,
            train_metrics=self._train_metrics,
        )
        for listener in self.listeners:
            listener.on_round(summary)
        self._round_started = None
        return scores["loss"], {"accuracy": scores["accuracy"]}
