"""Private federated evaluation (``--private-evaluation``): the sites' figures through SecAgg+.

In an evaluation round, the sites that the reporting strategy picks to score the new global
model get it in a SecAgg+ exchange instead of ``evaluate`` messages: each returns, in place of
an update, the vector of the task's declared metrics on its evaluation part, weighted by its
example count like an update (``PRIVATE_EVALUATION_KEY`` names them in order). The
coordinator unmasks only the sum, so it records the example-weighted mean of every metric and
which sites took part, never a site's own figures. A site that fails or drops out is left
out of the sum, as SecAgg+ leaves out a dropped update; fewer than SecAgg+'s minimum of
sites asked and the round's evaluation is skipped with the reason recorded.

The same SecAgg+ quantization as the updates applies: a metric is sent as
``value × min(examples, max_weight) / max_weight`` within ``±clipping_range``, rounded to a
quantization step, so the mean is off by at most ``sites × step × max_weight / total
examples`` (2e-3 for three sites of 20 examples at the defaults), and a site whose weighted
figure falls outside the range refuses rather than sending a clipped one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
from flwr.common import FitIns, FitRes, Parameters, parameters_to_ndarrays

from fedweave.config.cohorts import MIN_SECAGG_COHORT
from fedweave.contract import (
    PRIVATE_EVALUATION_KEY,
    SECAGG_CLIP_KEY,
    SECAGG_MAX_WEIGHT_KEY,
    SITE_NAME_METRIC,
)
from fedweave.coordinator.rounds.deadlines import RoundDeadline
from fedweave.coordinator.rounds.secure_agg import SecAggSettings
from fedweave.coordinator.rounds.vector_exchange import VectorExchangeStrategy, failure_text
from fedweave.flower_patches.default_workflow import ClientProxy
from fedweave.history.records import SiteResult

log = logging.getLogger("fedweave.coordinator")


class PrivateEvaluationStrategy(VectorExchangeStrategy):
    """One SecAgg+ exchange: the given sites score ``FitIns.parameters`` and send their
    metric vectors; keeps the unmasked example-weighted mean.

    Args:
        asked: (site, instruction) pairs; every instruction carries the global model and
            ``PRIVATE_EVALUATION_KEY``.
        names: the metrics, in the order of the vector.
    """

    def __init__(self, asked: list[tuple[ClientProxy, FitIns]], names: Sequence[str]) -> None:
        self.asked = asked
        self.names = list(names)
        self.mean: dict[str, float] | None = None
        self.counted: list[tuple[ClientProxy, FitRes]] = []
        self.failures: list[str] = []

    def configure_fit(self, server_round, parameters, client_manager):  # type: ignore[no-untyped-def]
        return self.asked

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict]:
        self.failures = [failure_text(f) for f in failures]
        if not results:
            return None, {}
        # SecAgg+ hands every result the same unmasked mean
        arrays = parameters_to_ndarrays(results[0][1].parameters)
        vector = np.concatenate([np.ravel(a) for a in arrays]) if arrays else np.zeros(0)
        if vector.shape != (len(self.names),) or not np.all(np.isfinite(vector)):
            self.failures.append(
                f"the unmasked evaluation has {vector.size} values, not the {len(self.names)} "
                "metrics asked, or values that are not finite"
            )
            return None, {}
        self.mean = {name: float(value) for name, value in zip(self.names, vector)}
        self.counted = list(results)
        return None, {}


def private_evaluate_workflow(
    reporting: Any,
    make_secagg_workflow: Callable[[int], Callable[..., None]],
    names: Sequence[str],
    secagg: SecAggSettings,
    deadline: RoundDeadline,
):
    """The evaluate step of each round under ``--private-evaluation``.

    Args:
        reporting: the run's ``ReportingStrategy`` (it picks the sites, as for a plain
            evaluation, and records the outcome with ``record_private_evaluation``).
        make_secagg_workflow: a SecAgg+ workflow for that many sites.
        names: the task's declared metrics (``loss`` first), the vector's layout.
        secagg: the run's SecAgg+ ranges, sent to the sites like a round's.
        deadline: the round deadline (named in the reason of a site left out).
    """
    from flwr.server import LegacyContext

    from fedweave.flower_patches import message_records as compat
    from fedweave.flower_patches.default_workflow import (
        MAIN_CONFIGS_RECORD,
        MAIN_PARAMS_RECORD,
        Key,
    )

    def evaluate_workflow(grid, context) -> None:
        cfg = context.state.config_records[MAIN_CONFIGS_RECORD]
        current_round = cast(int, cfg[Key.CURRENT_ROUND])
        parameters = compat.arrayrecord_to_parameters(
            context.state.array_records[MAIN_PARAMS_RECORD], keep_input=True
        )
        instructions = reporting.configure_evaluate(
            current_round, parameters, context.client_manager
        )
        asked = [proxy for proxy, _ in instructions]
        if not instructions:
            reporting.record_private_evaluation(current_round, None, [], None)
            return
        if len(asked) < MIN_SECAGG_COHORT:
            reason = (
                f"private evaluation skipped: {len(asked)} sites to evaluate, fewer than the "
                f"{MIN_SECAGG_COHORT} secure aggregation needs"
            )
            reporting.record_private_evaluation(current_round, None, [], reason)
            return
        config = {
            **instructions[0][1].config,
            PRIVATE_EVALUATION_KEY: ",".join(names),
            SECAGG_CLIP_KEY: secagg.clipping_range,
            SECAGG_MAX_WEIGHT_KEY: secagg.max_weight,
        }
        strategy = PrivateEvaluationStrategy(
            [(proxy, FitIns(parameters, config)) for proxy in asked], names
        )
        stage = LegacyContext(
            context=context, config=context.config, strategy=strategy,
            client_manager=context.client_manager,
        )  # fmt: skip
        mark = reporting.site_replies.mark()
        make_secagg_workflow(len(asked))(grid, stage)
        counted = {str(proxy.node_id): res for proxy, res in strategy.counted}
        # a site left out said why (noted under its node by the run's grid), or nothing
        silent = f"not in the secure sum by the round deadline ({deadline.seconds:g} s)"
        sites = []
        for proxy in asked:
            node = str(proxy.node_id)
            if node in counted:
                sites.append(SiteResult(
                    node, "ok", int(counted[node].num_examples), _name_only(counted[node].metrics)
                ))  # fmt: skip
                continue
            said = reporting.site_replies.said(current_round, proxy.node_id, since=mark)
            sites.append(
                SiteResult(node, said.status, metrics=said.metrics(), reason=said.reason)
                if said is not None
                else SiteResult(node, "late", reason=silent)
            )
        failures = "; ".join(dict.fromkeys(strategy.failures)) or silent
        reason = None if strategy.mean is not None else f"private evaluation failed: {failures}"
        if reason:
            log.warning("round %s: %s", current_round, reason)
        reporting.record_private_evaluation(current_round, strategy.mean, sites, reason)

    return evaluate_workflow


def _name_only(metrics: dict) -> dict:
    """What a site's private-evaluation reply may say in the clear: its name."""
    name = metrics.get(SITE_NAME_METRIC)
    return {SITE_NAME_METRIC: name} if isinstance(name, str) else {}
