"""The ServerApp body of ``fedweave evaluate --run RUN``, in Flower's ``flwr-serverapp``
process: every connected site scores the evaluated run's models (``global``, and
``best-round-N`` when its ``--select-metric`` picked another round) in one round trip, and
the result is recorded as the new run's one round (``deployed_server_app.py`` hands an
evaluation-only plan here). The ``fedweave evaluate`` process checked the evaluated run and
recorded the new one before (``coordinator/command/evaluation_setup.py``); the plan
(``coordinator/plan.py``) is all the two share.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedweave.config import RunConfig
from fedweave.coordinator.serverapp.history_run import recording_run

SITES_WAIT_S = 30.0
"""How long the ServerApp waits for ``--min-clients`` sites the CLI saw connected (a site
may be reconnecting); it then scores with every site connected."""


@dataclass(frozen=True)
class _Site:
    """A connected site, as ``evaluate_at_sites`` wants it (anything with a ``node_id``)."""

    node_id: int


def _connected_nodes(grid: Any, wanted: int, wait_s: float = SITES_WAIT_S) -> list[int]:
    deadline = time.monotonic() + wait_s
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= wanted or time.monotonic() > deadline:
            if not nodes:
                raise RuntimeError("no site connected to score the models")
            return nodes
        time.sleep(0.5)


def score_at_sites(
    grid: Any,
    config: RunConfig,
    models: list[tuple[str, list]],
    statistics: dict[str, Any] | None,
    site_replies: Any = None,
    run_config: dict[str, Any] | None = None,
) -> Any:
    """Send every connected site each of ``models`` (name, weights; the first is the final
    global model) and gather one ``RoundSummary``: the final model's figures, each site's
    evaluation of it, and the matrix. ``site_replies``: the ``SiteReplies`` the grid notes
    what each site said in (for a failed site's name), or None. ``run_config``: more keys
    every site is told (a LoRA run's adapter, ``recorded_adapter_config``)."""
    from flwr.common import EvaluateIns, ndarrays_to_parameters

    from fedweave.contract import BATCH_SIZE_KEY, CROSS_SITE_MODEL_KEY, ROUND_KEY, SEED_KEY
    from fedweave.coordinator.rounds.federated_evaluation import (
        evaluate_at_sites,
        site_evaluations,
        weighted_evaluation,
    )
    from fedweave.coordinator.rounds.federated_statistics import StatisticsSink
    from fedweave.history.records import SiteResult
    from fedweave.history.round_summary import RoundSummary

    timeout = float(config.federation.round_timeout or 300.0)
    sites = [_Site(node) for node in _connected_nodes(grid, config.federation.min_clients)]
    base: dict[str, Any] = {
        ROUND_KEY: 1,
        BATCH_SIZE_KEY: config.training.batch_size,
        SEED_KEY: config.training.seed,
        **StatisticsSink(statistics).config(),
        **(run_config or {}),
    }
    instructions, expected = [], []
    for index, (name, weights) in enumerate(models):
        tag = {} if index == 0 else {CROSS_SITE_MODEL_KEY: name}
        ins = EvaluateIns(ndarrays_to_parameters(weights), {**base, **tag})
        instructions += [(site, ins) for site in sites]
        if index:
            expected += [(name, str(site.node_id)) for site in sites]
    started, started_at = time.perf_counter(), datetime.now(timezone.utc)
    results, failures = evaluate_at_sites(grid, instructions, "1", timeout, site_replies)
    late = f"no evaluation within the deadline ({timeout:g} s)"
    evaluations, matrix = site_evaluations(
        results, failures, [site.node_id for site in sites], expected, late
    )
    federated = weighted_evaluation(
        [(site, res) for site, res in results if CROSS_SITE_MODEL_KEY not in res.metrics]
    )
    return RoundSummary(
        round=1,
        loss=federated.get("loss"),
        accuracy=federated.get("accuracy"),
        seconds=time.perf_counter() - started,
        started_at=started_at,
        ended_at=datetime.now(timezone.utc),
        weights=models[0][1],
        sites=[
            SiteResult(s.site_id, s.status, s.num_examples, dict(s.metrics), reason=s.reason)
            for s in evaluations
        ],  # every site asked, by how its evaluation of the final model went
        federated=federated,
        evaluations=evaluations,
        cross_site=matrix,
        statistics=statistics,
    )


def run_evaluation(plan: Any, grid: Any, context: Any) -> None:
    """The ServerApp body of ``fedweave evaluate``: score, record one round, finish the run.

    The round goes through ``SiteNames`` (sites recorded by name) to the same
    ``HistoryRecorder`` a training run uses, so the final model is checkpointed with the new
    run (``history export`` and ``predict`` work on it) and the evaluated run is only read.
    """
    from fedweave.coordinator.plan import registered_site_names
    from fedweave.coordinator.rounds.history_listener import HistoryRecorder
    from fedweave.coordinator.rounds.site_names import SiteNames
    from fedweave.coordinator.rounds.site_outcomes import OutcomeGrid, SiteReplies
    from fedweave.history.metrics import recorded_statistics
    from fedweave.history.model_export import checkpoint_weights, evaluated_models
    from fedweave.learning.adapters import recorded_adapter_config
    from fedweave.learning.personal import recorded_personal_config

    with recording_run(plan) as recording:
        store, config = recording.store, plan.config
        evaluated = store.get_run(str(config.evaluation.run))
        rows = store.rounds(evaluated.run_id)
        models = [
            (model.name, checkpoint_weights(model.row))
            for model in evaluated_models(evaluated, rows)
        ]
        if not models:
            raise RuntimeError(f"run {evaluated.run_id} has no recorded model")
        site_replies = SiteReplies()  # what each site said, by node, with its name
        grid = OutcomeGrid(grid, site_replies)
        summary = score_at_sites(
            grid, config, models, recorded_statistics(rows), site_replies,
            {**recorded_adapter_config(evaluated.config),
             **recorded_personal_config(evaluated.config, evaluated.run_id)},
        )  # fmt: skip
        recorder = HistoryRecorder(store, plan.run_id, Path(config.history.checkpoint_dir))
        SiteNames([recorder], registered_site_names(plan.deployment_file)).on_round(summary)
