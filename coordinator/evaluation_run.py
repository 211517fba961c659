"""``fedweave evaluate --run RUN``: an evaluation-only deployed run that trains nothing.

Every connected site scores a recorded federated run's final global model (model
``global``) and, when the run's ``--select-metric`` picked another round, that round's model
(``best-round-N``), in one round trip that closes at ``--round-timeout`` (default 300 s). The
result is a new history run of one round: the final model's example-weighted figures, each
site's evaluation, and the cross-site matrix (model × site × metric) that ``fedweave history
show`` prints. The evaluated run is only read, never written.

Two processes share this module, as with ``deployed_run.py``: the CLI checks the evaluated
run and records the new one before its SuperLink starts (``prepare_evaluation``), and Flower's
``flwr-serverapp`` sends the models and records the round (``run_evaluation``). The run's
settings (task, label column, seed, batch size, best-model metric) come from the evaluated
run's stored config; connection, deployment and history settings from the command line.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedweave.config import Resolved, RunConfig
from fedweave.config.run_config import SETTINGS, coerce
from fedweave.config.sections import COMMAND_SETTINGS
from fedweave.errors import UserError

GLOBAL_MODEL = "global"

CARRIED = ("task", "label_column", "seed", "batch_size", "select_metric", "select_mode")
"""Settings the evaluation takes from the evaluated run (``batch_size`` only when the command
line does not give one); they are stored with the new run too, so ``history show`` prints its
matrix by the same metric and ``history export`` picks its best model the same way."""

SITES_WAIT_S = 30.0
"""How long the ServerApp waits for ``--min-clients`` sites the CLI saw connected (a site
may be reconnecting); it then scores with every site connected."""


def best_model_name(round_number: int) -> str:
    return f"best-round-{round_number}"


@dataclass(frozen=True)
class EvaluatedModel:
    """One model of the evaluated run that every site scores."""

    name: str
    round: int
    row: dict[str, Any]


def evaluated_models(info: Any, rows: list[dict[str, Any]]) -> list[EvaluatedModel]:
    """The run's final model (``global``) and, when its best round by ``--select-metric`` is
    another one, that round's (``best-round-N``); empty without a recorded checkpoint."""
    from fedweave.history.model_export import chosen_rounds

    final, best, _ = chosen_rounds(info, rows)
    if final is None:
        return []
    models = [EvaluatedModel(GLOBAL_MODEL, int(final["round"]), final)]
    if best is not None and best["round"] != final["round"]:
        models.append(EvaluatedModel(best_model_name(int(best["round"])), int(best["round"]), best))
    return models


def _stored_values(stored: dict[str, Any] | None) -> dict[str, Any]:
    """Every setting a run stored (whatever its command), by field name."""
    tables = (stored or {}).get("settings") or {}
    flat = {k: v for table in tables.values() if isinstance(table, dict) for k, v in table.items()}
    return {
        name: coerce(SETTINGS[name], value, f"stored config {name}")
        for name, value in flat.items()
        if name in SETTINGS and value is not None
    }


def _check_evaluable(info: Any, stored: dict[str, Any]) -> None:
    if info.mode != "federated":
        raise UserError(
            f"run {info.run_id} is a {info.mode} run; fedweave evaluate scores a federated "
            "run's global model (a gossip run has one model per peer)"
        )
    if stored.get("private_evaluation"):
        raise UserError(
            f"run {info.run_id} ran with --private-evaluation: its sites' own figures never "
            "reached the coordinator, and a cross-site matrix would show them; evaluate it "
            "with its own federated evaluation instead"
        )


def evaluation_config(config: RunConfig, resolved: Resolved, info: Any) -> RunConfig:
    """The new run's settings: the evaluated run's ``CARRIED`` ones, the command line's
    for the rest; one round, closing at ``--round-timeout`` (default 300 s)."""
    from fedweave.coordinator.deadlines import NO_DATA_DEADLINE_SECONDS

    stored = _stored_values(info.config)
    carried = {name: stored[name] for name in CARRIED if name in stored}
    if "batch_size" in resolved.explicit:
        carried.pop("batch_size", None)
    carried["task"] = info.task  # the run's own record of it wins
    return config.replace(
        **carried,
        run=info.run_id,
        rounds=1,
        round_timeout=config.federation.round_timeout or NO_DATA_DEADLINE_SECONDS,
        secure_agg=False,  # each site's figures reach the coordinator (it is the matrix)
        checkpoint_dir=config.history.checkpoint_dir.resolve(),
    )


def _check_models(info: Any, models: list[EvaluatedModel]) -> None:
    """Each model's checkpoint readable, intact and fitting the task as installed here."""
    from fedweave.history.model_export import checkpoint_weights, named_weights

    if not models:
        raise UserError(
            f"run {info.run_id} has no recorded model (no round recorded a checkpoint); pick "
            "a run that completed a round: fedweave history runs"
        )
    for model in models:
        named_weights(info.task, checkpoint_weights(model.row))


def evaluation_header(facts: dict[str, Any]) -> str:
    """One line saying what protects this run, as the coordinator's header does."""
    tls = "on" if facts["tls"] else "OFF"
    auth = "required" if facts["site_authentication"] else "OFF (any CA holder joins)"
    return (
        f"evaluation only (nothing is trained); TLS {tls}; site authentication {auth}; "
        "each site's figures reach the coordinator in the clear (no SecAgg+: they are the "
        f"matrix); deadline {facts['round_timeout']:g} s"
    )


def prepare_evaluation(
    store: Any, config: RunConfig, resolved: Resolved, *, tls: bool, site_authentication: bool
) -> Any:
    """Check the evaluated run (exists, federated, has a readable model) and record the new
    run; returns its ``DeployPlan``. Runs before the SuperLink starts: every refusal is a
    ``UserError`` (one line, exit 2)."""
    from fedweave.coordinator.deployed_run import DeployPlan

    info = store.get_run(config.evaluation.run or "")
    _check_evaluable(info, _stored_values(info.config))
    models = evaluated_models(info, store.rounds(info.run_id))
    _check_models(info, models)
    config = evaluation_config(config, resolved, info)
    facts = {
        "evaluation_only": True,
        "secure_aggregation": {"on": False},
        "tls": tls,
        "site_authentication": site_authentication,
        "round_timeout": config.federation.round_timeout,
        "min_clients": config.federation.min_clients,
    }
    stored = {
        "command": "evaluate",
        "settings": config.stored((*COMMAND_SETTINGS["evaluate"], *CARRIED)),
        "evaluated": {
            "run_id": info.run_id,
            "models": {model.name: model.round for model in models},
            "protections": info.config.get("protections"),
        },
        "protections": facts,
    }
    if info.config.get("schema") is not None:
        stored["schema"] = info.config["schema"]
    _echo(evaluation_header(facts))
    run_id = uuid.uuid4().hex[:12]
    store.start_run("federated", info.task, stored, config.training.seed, run_id=run_id)
    _echo(f"run {run_id} recorded in the history: evaluates run {info.run_id}")
    return DeployPlan(run_id, config)


def started_line(plan: Any, flower_run: int, store: Any) -> str:
    info = store.get_run(plan.run_id)
    models = (info.config.get("evaluated") or {}).get("models") or {}
    shown = ", ".join(f"{name} (round {number})" for name, number in models.items())
    return (
        f"run {plan.run_id} started (Flower run {flower_run}): every connected site scores "
        f"run {plan.config.evaluation.run}'s {shown}; nothing is trained; closes after "
        f"{plan.config.federation.round_timeout:g} s"
    )


def matrix_lines(store: Any, run_id: str) -> list[str]:
    """The recorded matrix for the console: one line per model, a cell per site."""
    from fedweave.history.metrics import cross_site_matrix

    info = store.get_run(run_id)
    metric = str(_stored_values(info.config).get("select_metric") or "loss").rsplit(".", 1)[-1]
    found = cross_site_matrix(store.rounds(run_id), metric)
    if found is None:
        return []
    models, sites, cells = found
    lines = [f"cross-site evaluation ({metric}; models × sites):"]
    for model in models:
        cells_text = ", ".join(f"{site} {cells.get((model, site), '-')}" for site in sites)
        lines.append(f"  {model}: {cells_text}")
    lines.append(f"recorded as run {run_id}: fedweave history show {run_id}")
    return lines


def _echo(message: str) -> None:
    import typer

    typer.echo(message, err=True)


# --- the ServerApp side (Flower's flwr-serverapp process) ---------------------------------


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
) -> Any:
    """Send every connected site each of ``models`` (name, weights; the first is the final
    global model) and gather one ``RoundSummary``: the final model's figures, each site's
    evaluation of it, and the matrix. ``site_replies``: the ``SiteReplies`` the grid notes
    what each site said in (for a failed site's name), or None."""
    from flwr.common import EvaluateIns, ndarrays_to_parameters

    from fedweave.contract import BATCH_SIZE_KEY, CROSS_SITE_MODEL_KEY, ROUND_KEY, SEED_KEY
    from fedweave.coordinator.federated_evaluation import (
        evaluate_at_sites,
        site_evaluations,
        weighted_evaluation,
    )
    from fedweave.coordinator.statistics import StatisticsSink
    from fedweave.history.records import SiteResult
    from fedweave.history.round_summary import RoundSummary

    timeout = float(config.federation.round_timeout or 300.0)
    sites = [_Site(node) for node in _connected_nodes(grid, config.federation.min_clients)]
    base: dict[str, Any] = {
        ROUND_KEY: 1,
        BATCH_SIZE_KEY: config.training.batch_size,
        SEED_KEY: config.training.seed,
        **StatisticsSink(statistics).config(),
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
    from fedweave.coordinator.deployed_run import recording_run
    from fedweave.coordinator.history_recorder import HistoryRecorder
    from fedweave.coordinator.site_names import SiteNames
    from fedweave.coordinator.site_outcomes import OutcomeGrid, SiteReplies
    from fedweave.history.metrics import recorded_statistics
    from fedweave.history.model_export import checkpoint_weights

    with recording_run(plan) as store:
        config = plan.config
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
        summary = score_at_sites(grid, config, models, recorded_statistics(rows), site_replies)
        recorder = HistoryRecorder(store, plan.run_id, Path(config.history.checkpoint_dir))
        SiteNames([recorder]).on_round(summary)
