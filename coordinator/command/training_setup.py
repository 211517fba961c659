"""``fedweave coordinator``'s run before its first round (once ``run_checks.py`` has checked
its options): its input checked before anything starts (``check_run_input``), then, while the
SuperLink starts, the history run created or resumed, what protects it said once, and the plan
the ServerApp will run (``coordinator/plan.py``). ``evaluation_setup.py`` is the same for
``fedweave evaluate``. Every refusal is a ``UserError`` (one line, exit 2).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import typer

from fedweave.config import Resolved, RunConfig
from fedweave.coordinator.plan import DeployPlan


def _echo(message: str) -> None:
    typer.echo(message, err=True)


def _with_protections(
    config: RunConfig, test_data, site_authentication: bool
) -> tuple[RunConfig, dict]:
    """The config with its round deadline resolved (``--round-timeout`` or sized from the
    task on ``test_data``), and the run's protections for the header and the history."""
    from fedweave.coordinator.command.run_header import protections
    from fedweave.coordinator.rounds.round_settings import ServerSettings

    settings = ServerSettings(config, config.federation.min_clients, config.training.rounds)
    deadline = settings.deadline(test_data)
    facts = protections(
        config, settings.cohort, deadline, central_data=test_data is not None,
        tls=not config.connection.insecure,
        site_authentication=site_authentication,
    )  # fmt: skip
    return settings.resolved(deadline), facts


def _absolute_paths(config: RunConfig) -> RunConfig:
    """Paths the ServerApp reads, made absolute: Flower may run it in another directory."""
    test_data = config.data.test_data
    return config.replace(
        checkpoint_dir=config.history.checkpoint_dir.resolve(),
        test_data=test_data.resolve() if test_data else None,
    )


@dataclass(frozen=True)
class CheckedRun:
    """A run whose input ``check_run_input`` accepted: all ``prepare_run`` needs, and nothing
    started or recorded yet.

    Args:
        config: the run's settings (a resumed run's merged with the given ones).
        stored: the settings as the history will record them.
        resumed: the history's run being resumed, or None for a new run.
        test_data: the coordinator's held-out data, or None.
    """

    config: RunConfig
    stored: dict
    resumed: Any
    test_data: Any


def check_run_input(store, config: RunConfig, resolved: Resolved) -> CheckedRun:
    """Every refusal of the run's input (the run to resume, its settings, the held-out
    data) as a ``UserError``, before anything starts; cheap (no torch)."""
    from fedweave.config.commands import check_settings
    from fedweave.config.resume import merge_for_resume, stored_run_config
    from fedweave.coordinator.rounds.privacy_ledger import check_resumable
    from fedweave.coordinator.rounds.round_settings import test_data_of
    from fedweave.history.metrics import recorded_privacy
    from fedweave.learning.adapters import run_adapter
    from fedweave.learning.initial_model import pin_initial_model
    from fedweave.learning.personal import task_local_layers
    from fedweave.learning.statistics import pinned_schema
    from fedweave.learning.task_packages import pinned_for_run
    from fedweave.learning.tasks import load_task
    from fedweave.privacy_accounting import with_planned_noise

    config = _absolute_paths(config)  # stored paths are absolute: compare like with like
    run = store.get_run(config.history.resume) if config.history.resume else None
    if run is not None:
        config = merge_for_resume(run, config, resolved)
        check_settings(config, resolved.command)  # the stored settings with the given ones
        rows = store.rounds(run.run_id)  # a DP run's ledger: continuable, budget left?
        check_resumable(config.privacy, recorded_privacy(rows, config.privacy.dp), len(rows))
    config = with_planned_noise(config)  # --target-epsilon: the noise it stands for
    stored = stored_run_config(config, "coordinator")
    schema = pinned_schema(load_task(config.data.task))
    if schema is not None:
        stored["schema"] = schema
    recorded = (run.config or {}).get("task_package") if run is not None else None
    package = pinned_for_run(config.data.task, recorded)
    if package is not None:
        stored["task_package"] = package
    config = pin_initial_model(config, stored, run)
    adapter = run_adapter(config)  # --lora-targets and --lora-rank checked on the model
    if adapter is not None:
        stored["adapter"] = adapter
    local = task_local_layers(config.data.task)  # a task's local_layers checked on its model
    if local:
        stored["local_layers"] = list(local)
    return CheckedRun(config, stored, run, test_data_of(config))


def prepare_run(
    store, checked: CheckedRun, *, site_authentication: bool, operator: str | None = None
) -> DeployPlan:
    """Create the history run, or resume one (same settings, after its last round); print
    what protects it; returns the plan the ServerApp will run (``operator``: who submitted
    it, for an operator's study). A default deadline times the task here (torch: ~4 s),
    which the coordinator overlaps with its SuperLink's start."""
    from fedweave.coordinator.command.run_header import header_line

    run, stored = checked.resumed, dict(checked.stored)
    config, stored["protections"] = _with_protections(
        checked.config, checked.test_data, site_authentication
    )
    _echo(header_line(stored["protections"]))
    if run is not None:
        store.mark_running(run.run_id)
        _echo(
            f"resuming run {run.run_id} after round {run.rounds_completed} of "
            f"{config.training.rounds}"
        )
        return DeployPlan(run.run_id, config, operator=operator)
    run_id = uuid.uuid4().hex[:12]
    store.start_run("federated", config.data.task, stored, config.training.seed, run_id=run_id)
    _echo(f"run {run_id} recorded in the history")
    return DeployPlan(run_id, config, operator=operator)
