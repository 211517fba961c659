"""``fedweave coordinator``'s checks of what its options name: the task (and, under DP, that
it needs no statistics from the sites' data), the coordinator's held-out data, and whether
anything would score the run (``fedweave simulate`` runs the same checks on its own test
data: ``simulations/run_checks.py``).

What the options alone decide (bounds, and rules across options such as SecAgg+ against the
strategy or the schedule) is checked when the options are resolved
(``fedweave/config/commands.check_settings``, ``fedweave/config/rules.py``). Every refusal is a
``UserError`` (one line, exit 2).
"""

from __future__ import annotations

from typing import Any

from fedweave.config import RunConfig
from fedweave.errors import UserError


def check_run(config: RunConfig) -> None:
    """The run's task loads, its test data reads, and something scores its rounds, before
    anything starts."""
    from fedweave.learning.data import central_test_data
    from fedweave.learning.tasks import load_task

    task = load_task(config.data.task)
    check_named_sites(config)
    check_statistics_privacy(config, task)
    test_data = central_test_data(task, config.data.test_data, config.data.label_column)
    check_scoring(config, test_data)


def check_named_sites(config: RunConfig) -> None:
    """Every site ``--sites`` names has a key registered in ``TLS_DIR/sites/`` (the names the
    coordinator knows its sites by)."""
    from fedweave.certs import registered_site_keys
    from fedweave.config.rules import site_names

    names = site_names(config.federation.sites)
    tls_dir = config.connection.tls_dir
    if not names or tls_dir is None:
        return
    registered = sorted(path.stem for path in registered_site_keys(tls_dir))
    unknown = [name for name in names if name not in registered]
    if unknown:
        known = ", ".join(registered) or "none yet"
        raise UserError(
            f"--sites names {', '.join(unknown)}, not registered here (registered: {known}); "
            "register a site with `fedweave sites add-key`, or fix the name"
        )


def check_statistics_privacy(config: RunConfig, task: Any) -> None:
    """Refuse a DP run of a task that would gather statistics from the sites' data before
    round 1 (not a DP release) and declares no bounds to scale with instead."""
    from fedweave.learning.statistics import dp_statistics_problem

    if config.privacy.dp == "none":
        return
    problem = dp_statistics_problem(task, config.data.task)
    if problem is not None:
        raise UserError(f"--dp {config.privacy.dp}: {problem}")


def check_scoring(config: RunConfig, test_data: Any) -> None:
    """Refuse a run nothing would score: no test data at the coordinator and no federated
    evaluation; a private evaluation of a task that does not declare its metrics; and a
    ``--select-metric`` the task does not compute (when it says which)."""
    from fedweave.learning.task_metrics import task_metrics
    from fedweave.learning.tasks import load_task

    evaluation = config.evaluation
    if test_data is None and evaluation.evaluate_every == 0:
        raise UserError(
            f"nothing would score the rounds: task '{config.data.task}' has no data at the "
            "coordinator and federated evaluation is off; give --test-data FILE or leave "
            "--evaluate-every at 1 or more"
        )
    task = config.data.task
    known = task_metrics(load_task(task))
    if evaluation.private_evaluation and known is None:
        raise UserError(
            f"task '{task}' does not declare its metrics (a `metrics` tuple), which a private "
            "evaluation needs to lay out its sums; declare them or drop --private-evaluation"
        )
    if known is not None and evaluation.select_metric not in known:
        raise UserError(
            f"--select-metric {evaluation.select_metric}: task '{task}' computes "
            f"{', '.join(known)}; pick one of them"
        )
