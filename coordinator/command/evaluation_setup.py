"""``fedweave evaluate --run RUN``: an evaluation-only deployed run that trains nothing.

Every connected site scores a recorded federated run's final global model (model
``global``) and, when the run's ``--select-metric`` picked another round, that round's model
(``best-round-N``), in one round trip that closes at ``--round-timeout`` (default 300 s). The
result is a new history run of one round: the final model's example-weighted figures, each
site's evaluation, and the cross-site matrix (model × site × metric) that ``fedweave history
show`` prints. The evaluated run is only read, never written.

This is the ``fedweave evaluate`` process's half: it checks the evaluated run and records the
new one before its SuperLink starts (``prepare_evaluation``), then prints what was recorded.
Flower's ``flwr-serverapp`` sends the models and records the round
(``coordinator/serverapp/evaluation_app.py``); the plan (``coordinator/plan.py``) is all the
two share. The run's settings (task, label column, seed, batch size, best-model metric) come
from the evaluated run's stored config; connection, deployment and history settings from the
command line.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from fedweave.config import Resolved, RunConfig
from fedweave.config.run_config import SETTINGS, coerce
from fedweave.config.sections import COMMAND_SETTINGS
from fedweave.errors import UserError

if TYPE_CHECKING:
    from fedweave.history.model_export import EvaluatedModel

CARRIED = ("task", "label_column", "seed", "batch_size", "select_metric", "select_mode")
"""Settings the evaluation takes from the evaluated run (``batch_size`` only when the command
line does not give one); they are stored with the new run too, so ``history show`` prints its
matrix by the same metric and ``history export`` picks its best model the same way."""

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
    from fedweave.coordinator.rounds.deadlines import NO_DATA_DEADLINE_SECONDS

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
        named_weights(info.task, checkpoint_weights(model.row), info.config)


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
    from fedweave.coordinator.plan import DeployPlan
    from fedweave.history.model_export import evaluated_models

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
