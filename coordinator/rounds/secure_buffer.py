"""One secure buffer of an asynchronous run under SecAgg+: a SecAgg+ round among the sites
whose held updates fill the buffer, so the coordinator learns only their weighted sum.

FedBuff (``fedweave/coordinator/rounds/fedbuff.py``) moves the model every ``--buffer`` (K) updates.
Under SecAgg+ a site's job only trains and the site holds its update
(``fedweave/client/held_updates.py``); the first K sites with an update ready form the
buffer's cohort, and this runs Flower's SecAgg+ workflow (fedweave's staged one, with the
round deadline and its dropout tolerance: ``coordinator/rounds/secure_agg.py``) among exactly
them. Each site's instruction names its held job and the update's staleness weight, and
carries no model; each answers ``staleness_weight * update`` weighted by its examples, so
the unmasked result is FedBuff's step before ``--server-lr``::

    sum_i n_i * s_i * update_i / sum_i n_i

over the sites that stayed to the end of the round (SecAgg+ drops a site that goes silent
and rebuilds its masks from its neighbours' shares). The coordinator never holds a single
site's update, only this sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common import FitIns, Parameters, parameters_to_ndarrays
from flwr.server import LegacyContext, ServerConfig, SimpleClientManager

from fedweave.contract import DELIVER_KEY, STALENESS_WEIGHT_KEY
from fedweave.coordinator.rounds.site_outcomes import OutcomeGrid, SiteReplies
from fedweave.coordinator.rounds.vector_exchange import VectorExchangeStrategy
from fedweave.flower_patches.default_workflow import (
    MAIN_CONFIGS_RECORD,
    MAIN_PARAMS_RECORD,
    GridClientProxy,
)
from fedweave.flower_patches.default_workflow import Key as WorkflowKey

NO_MODEL = Parameters(tensors=[], tensor_type="numpy.ndarray")
"""What a delivery instruction carries instead of a model: nothing to train on."""


@dataclass
class BufferSum:
    """What one secure buffer's SecAgg+ round gave the coordinator.

    Attributes:
        update: the members' weighted mean update (``None``: the round failed, nothing
            applies).
        delivered: node id → (examples, the site's metrics) of the members in the sum.
        dropped: node id → (status, reason) of the members that are not.
    """

    update: list[np.ndarray] | None
    delivered: dict[int, tuple[int, dict]] = field(default_factory=dict)
    dropped: dict[int, tuple[str, str]] = field(default_factory=dict)


class _Delivery(VectorExchangeStrategy):
    """The strategy Flower's SecAgg+ workflow asks: who is in the round and what each is
    told (``configure_fit``), and where the unmasked sum goes (``aggregate_fit``)."""

    def __init__(self, instructions: dict[int, FitIns], grid: Any, run_id: int) -> None:
        super().__init__()
        self.instructions = instructions
        self.proxies = {node: GridClientProxy(node, grid, run_id) for node in instructions}
        self.results: list[tuple[Any, Any]] = []
        self.total: list[np.ndarray] | None = None

    def configure_fit(self, server_round, parameters, client_manager):  # type: ignore[no-untyped-def]
        return [(self.proxies[node], ins) for node, ins in self.instructions.items()]

    def aggregate_fit(self, server_round, results, failures):  # type: ignore[no-untyped-def]
        self.results = list(results)
        if results:  # SecAgg+ hands every member the same unmasked mean
            self.total = parameters_to_ndarrays(results[0][1].parameters)
        return None, {}


def secure_buffer_sum(
    grid: Any,
    context: Context,
    workflow: Any,
    round_label: int,
    members: dict[int, tuple[int, float]],
    fit_config: dict,
    traffic: Any | None = None,
    max_fit_count: float | None = None,
) -> BufferSum:
    """Run one SecAgg+ round (``workflow``: ``make_secagg_workflow`` for ``len(members)``
    sites) labelled ``round_label`` among ``members`` (node id → (held job number, staleness
    weight)), each told ``fit_config`` as well; ``traffic`` counts its bytes; a member claiming
    more than ``max_fit_count`` examples (SecAgg+'s ``max_weight``) is rejected before the
    sum (``OutcomeGrid``)."""
    replies = SiteReplies()
    outcome_grid = OutcomeGrid(grid, replies, traffic, max_fit_count)
    instructions = {
        node: FitIns(NO_MODEL, {**fit_config, DELIVER_KEY: job, STALENESS_WEIGHT_KEY: weight})
        for node, (job, weight) in members.items()
    }
    strategy = _Delivery(instructions, outcome_grid, context.run_id)
    legacy = LegacyContext(context, ServerConfig(num_rounds=1), strategy, SimpleClientManager())
    legacy.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord(
        {WorkflowKey.CURRENT_ROUND: round_label}
    )
    legacy.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
    workflow(outcome_grid, legacy)
    result = BufferSum(strategy.total)
    for proxy, res in strategy.results:
        result.delivered[int(proxy.node_id)] = (int(res.num_examples), dict(res.metrics))
    for node in members:
        if node in result.delivered:
            continue
        said = replies.said(round_label, node)
        result.dropped[node] = (
            (said.status, said.reason) if said is not None
            else ("lost", "dropped out of its buffer's SecAgg+ round, or the round halted")
        )  # fmt: skip
    if result.update is None:
        for node in result.delivered:
            result.dropped[node] = ("lost", "its buffer's SecAgg+ round failed")
        result.delivered.clear()
    return result
