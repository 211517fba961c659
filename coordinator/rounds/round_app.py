"""The ServerApp of a run's synchronous rounds (``make_server_app``): the chosen strategy over
the sampled sites, SecAgg+ by default, central evaluation, round reports; ``--schedule async``
gets ``fedbuff.py``'s instead. It runs wherever the round loop runs: inside Flower's
``flwr-serverapp`` in a deployment (``coordinator/serverapp/deployed_server_app.py``), in the
``fedweave simulate`` process in a simulation. What the rounds run with, and the checks
every command runs on it before anything starts: ``round_settings.py``.

Built on Flower's legacy strategy API (``LegacyContext`` + ``DefaultWorkflow``) because
SecAgg+ (``SecAggPlusWorkflow``) only plugs into that API.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.workflow import DefaultWorkflow

from fedweave.config import RunConfig
from fedweave.coordinator.rounds.central_evaluation import make_central_evaluator
from fedweave.coordinator.rounds.deadlines import (
    deadline_fit_workflow,
)
from fedweave.coordinator.rounds.downlink import HalfPrecisionGrid
from fedweave.coordinator.rounds.federated_evaluation import federated_evaluate_workflow
from fedweave.coordinator.rounds.federated_statistics import (
    StatisticsFirst,
    StatisticsSink,
    WithStatistics,
)
from fedweave.coordinator.rounds.model_health import ModelHealth
from fedweave.coordinator.rounds.privacy import wrap_for_central_dp
from fedweave.coordinator.rounds.privacy_ledger import BudgetSpent, PrivacyLedger
from fedweave.coordinator.rounds.private_evaluation import private_evaluate_workflow
from fedweave.coordinator.rounds.round_settings import (
    ServerSettings,
    private_metric_names,
)
from fedweave.coordinator.rounds.secure_agg import (
    make_secagg_workflow,
)
from fedweave.coordinator.rounds.simulated_clock import SimulatedClock
from fedweave.coordinator.rounds.site_names import SiteNames
from fedweave.coordinator.rounds.site_outcomes import OutcomeGrid, SiteReplies
from fedweave.coordinator.rounds.spooled_updates import SpooledUpdates
from fedweave.coordinator.rounds.strategies import make_strategy
from fedweave.coordinator.rounds.traffic import Traffic
from fedweave.history.records import SitesWait
from fedweave.history.round_summary import RoundListener, RoundStartListener
from fedweave.learning.adapters import run_task
from fedweave.learning.statistics import declared_statistics, needs_statistics
from fedweave.learning.tasks import load_task
from fedweave.learning.training import seed_everything
from fedweave.learning.weights import get_weights

GridWrapper = Callable[[Grid, SpooledUpdates | None], Grid]
"""``wire(grid, spooled)``: the SuperLink's grid wrapped so tensors move another way
(``--bulk-address``: ``bulk.BulkGrid``), updates held on disk in ``spooled`` where given."""

log = logging.getLogger(__name__)


def initial_weights(config: RunConfig, sha256: str | None = None) -> list[np.ndarray]:
    """The global model before round 1: the task's model built under the run's seed, or
    loaded from its ``--initial-model`` (a checked safetensors file; ``sha256``: the run's pin
    of it, when the run recorded one); with ``--peft lora``, the adapters' tensors alone (the
    base is each site's own copy of that file)."""
    training = config.training
    task = run_task(config, sha256)
    seed_everything(training.seed)
    model = task.build_model()
    if training.initial_model is not None and training.peft == "none":
        from fedweave.learning.initial_model import load_initial_model
        from fedweave.learning.personal import unwrapped

        load_initial_model(unwrapped(model), training.initial_model, config.data.task, sha256)
    return get_weights(model)


def site_pool(
    config: Any,
    registered_names: Callable[[], Mapping[str, str]] | None,
    sites_wait: Callable[[SitesWait | None], None] | None = None,
) -> Any:
    """The run's client manager: ``named_sites.NamedSites`` for a run that names its sites
    (``--sites``), else ``site_wait.BoundedSites``; either waits for sites at most
    ``--wait-for-sites`` seconds, telling ``sites_wait`` while it does."""
    from fedweave.config.rules import site_names
    from fedweave.coordinator.rounds.site_wait import BoundedSites

    bounded = {"bound_seconds": config.deployment.wait_for_sites, "noted": sites_wait}
    names = site_names(config.federation.sites)
    if not names:
        return BoundedSites(registered=registered_names, **bounded)
    from fedweave.coordinator.rounds.named_sites import NamedSites

    if registered_names is None:  # a simulation, or a run config written by hand: no keys
        raise ValueError("--sites needs the coordinator's registered site names")
    return NamedSites(frozenset(names), registered_names, **bounded)


def make_server_app(
    settings: ServerSettings,
    test_data: Any,
    start_weights: list[np.ndarray],
    listeners: Sequence[RoundListener] = (),
    statistics: dict[str, Any] | None = None,
    round_starts: Sequence[RoundStartListener] = (),
    clock_start: float = 0.0,
    registered_names: Callable[[], Mapping[str, str]] | None = None,
    privacy: dict[str, Any] | None = None,
    ended_early: Callable[[str], None] | None = None,
    wire: GridWrapper | None = None,
    sites_wait: Callable[[SitesWait | None], None] | None = None,
) -> ServerApp:
    """A ServerApp that runs ``settings.rounds`` rounds from ``start_weights`` (which it keeps
    only until round 1's model is made of them: the caller lets go of them too); a task that
    needs federated statistics gathers them first, unless ``statistics`` (a resumed run's
    recorded ones) are given; a DP run takes the task's declared ones instead (the command
    checked it has them). ``listeners`` hear of every finished round, ``round_starts`` of
    every round as it starts; ``clock_start``: a resumed run's simulated clock
    (``--site-speeds``). ``--schedule async`` runs ``fedbuff.py``'s app instead. The command
    that planned the run checked its options and inputs before (``check_settings``; the
    command's ``run_checks.py``). ``registered_names``: node id → the name its site key is
    registered under (deployed: ``plan.registered_site_names``; sites are recorded by it).
    ``privacy``: a resumed DP run's recorded ledger (``history.metrics.recorded_privacy``),
    which its rounds continue. ``ended_early`` is told why, when ``--max-epsilon`` ends the
    run before its last round (the run is then complete: nothing more may be spent).
    ``wire(grid, spooled)`` wraps the SuperLink's grid before anything else does (deployed
    with ``--bulk-address``: ``bulk.BulkGrid``, which moves the tensors beside the messages);
    ``sites_wait`` is told while a step waits for sites (``site_wait.BoundedSites``);
    ``spooled`` is where plain rounds' updates (and SecAgg+'s masked vectors) wait on disk
    to be added up a part at a time (``spooled_updates.py``), or ``None`` where they cannot
    (central DP clips each plain update in memory)."""
    config = settings.config
    deadline = settings.deadline(test_data)
    task = load_task(config.data.task)
    recorded = statistics is not None
    if not recorded and config.privacy.dp != "none" and needs_statistics(task):
        statistics = declared_statistics(task)  # nothing gathered: not a DP release
    sink = StatisticsSink(statistics)
    if config.federation.schedule == "async":
        from fedweave.coordinator.rounds.fedbuff import make_fedbuff_server_app

        return make_fedbuff_server_app(
            settings, test_data, start_weights, listeners, round_starts, clock_start, deadline,
            registered_names, wire,
        )
    # the app's own from here: let go once round 1's model is made of it (a model is large)
    initial = {"weights": start_weights}
    del start_weights
    ledger = PrivacyLedger(
        [ModelHealth(listeners, int(getattr(task, "num_classes", 0)))],
        config.privacy, settings.cohort, privacy,
    )  # fmt: skip
    named = [SiteNames([ledger], registered_names)]
    if settings.site_speeds is not None:
        named = [SimulatedClock(named, config.simulation.simulated_deadline, clock_start)]
    listeners = [deadline, WithStatistics(named, sink, told=recorded)]
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        spooled = (
            SpooledUpdates()
            if wire is not None and (settings.secure_agg or config.privacy.dp != "central")
            else None
        )
        site_replies, traffic = SiteReplies(), Traffic(spooled)
        if wire is not None:
            grid = wire(grid, spooled)
        # every workflow's replies, bound to their site, and their bytes counted
        grid = OutcomeGrid(
            grid, site_replies, traffic,
            settings.secagg.max_weight if settings.secure_agg else None,
            held=spooled.vector_layout if spooled is not None else None,
        )  # fmt: skip
        if settings.downlink == "fp16":  # outside the counting grid: it counts what is sent
            grid = HalfPrecisionGrid(grid)
        strategy = make_strategy(
            config.federation.strategy,
            settings.secure_agg,
            stragglers=config.simulation.stragglers,
            seed=config.training.seed,
            evaluator=make_central_evaluator(
                run_task(config), test_data, config.training.device, sink
            ),
            listeners=listeners,
            round_starts=round_starts,
            round_offset=settings.round_offset,
            max_update_norm=config.federation.max_update_norm,
            deadline=deadline,
            min_replies=config.federation.min_replies or 1,
            fraction_fit=settings.cohort / settings.min_clients,
            min_fit_clients=settings.cohort,
            min_available_clients=settings.min_clients,
            evaluate_every=config.evaluation.evaluate_every,
            last_round=settings.rounds,
            cross_site=config.evaluation.cross_site,
            site_replies=site_replies,
            compression=settings.compression,
            traffic=traffic,
            equal_weights=config.privacy.dp == "central",
            privacy_budget=ledger if ledger.max_epsilon is not None else None,
            spooled=spooled,
            fraction_evaluate=config.evaluation.fraction_evaluate,
            min_evaluate_clients=1,
            initial_parameters=ndarrays_to_parameters(initial.pop("weights")),
            on_fit_config_fn=lambda server_round: {
                **settings.fit_config(server_round, deadline.seconds), **sink.config(),
                **ledger.fit_config(),
            },
            on_evaluate_config_fn=lambda server_round: {
                **settings.evaluate_config(server_round), **sink.config(),
            },
            **settings.strategy_options(),
        )
        reporting = strategy
        strategy = wrap_for_central_dp(
            strategy, config.privacy, settings.secure_agg, settings.cohort
        )
        legacy = LegacyContext(
            context=context,
            config=ServerConfig(num_rounds=settings.rounds),
            strategy=strategy,
            client_manager=site_pool(config, registered_names, sites_wait),
        )

        def make_fit_workflow(cohort: int, secagg, held=None, training: bool = False):
            if settings.secure_agg:
                return make_secagg_workflow(
                    secagg, cohort, deadline, model_shaped=training, held_vectors=held
                )
            return deadline_fit_workflow(deadline, held)

        # the statistics stages' strategy reads its replies in memory: only training's are held
        fit_workflow = make_fit_workflow(
            settings.cohort, settings.training_secagg, spooled, training=True
        )
        if needs_statistics(task):
            fit_workflow = StatisticsFirst(
                fit_workflow,
                lambda: make_fit_workflow(settings.min_clients, settings.secagg),
                task,
                settings.min_clients,
                settings.statistics_config(deadline.seconds),
                sink,
            )
        evaluate_workflow = (
            private_evaluate_workflow(
                reporting,
                lambda cohort: make_secagg_workflow(settings.secagg, cohort, deadline),
                private_metric_names(task),
                settings.secagg,
                deadline,
            )
            if config.evaluation.private_evaluation
            else federated_evaluate_workflow(deadline, site_replies)
        )
        try:
            DefaultWorkflow(fit_workflow=fit_workflow, evaluate_workflow=evaluate_workflow)(
                grid, legacy
            )
        except BudgetSpent as spent:
            if ended_early is not None:
                ended_early(str(spent))
            else:
                log.warning("run ended before its last round: %s", spent)

    return app
