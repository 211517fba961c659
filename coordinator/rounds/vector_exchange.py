"""The base of a strategy for one exchange that is not a training round.

Federated statistics (``federated_statistics.py``) and private evaluation
(``private_evaluation.py``) each run one fit exchange, plain or through SecAgg+, in which
every site answers with a small vector instead of a model update. Such a strategy starts
from no parameters, never evaluates, and keeps its sites' failures as readable lines; this
class says so once.
"""

from __future__ import annotations

from typing import Any

from flwr.common import Parameters
from flwr.server import ClientManager
from flwr.server.strategy import Strategy

from fedweave.contract import one_line
from fedweave.coordinator.rounds.site_outcomes import failure_said


def failure_text(failure: Any) -> str:
    """One readable line for a fit failure: an error reply Flower wrapped in an exception
    (its status and reason), or a ``(site, FitRes)`` whose status says why."""
    if isinstance(failure, BaseException):
        said = failure_said(failure)
        return f"{said.status}: {said.reason}"
    _, res = failure
    return "failed: " + one_line(getattr(res.status, "message", str(res)))


class VectorExchangeStrategy(Strategy):
    """No initial parameters and no evaluation; subclasses say whom to ask
    (``configure_fit``) and what the answers mean (``aggregate_fit``)."""

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return None

    def configure_evaluate(self, server_round, parameters, client_manager):  # type: ignore[no-untyped-def]
        return []

    def aggregate_evaluate(self, server_round, results, failures):  # type: ignore[no-untyped-def]
        return None, {}

    def evaluate(self, server_round, parameters):  # type: ignore[no-untyped-def]
        return None
