"""What a task's evaluation returns, read without torch where the task says it (the processes
that only check a run's settings need no torch); the Task protocol is in ``task.py``."""

from __future__ import annotations


def task_metrics(task: object) -> tuple[str, ...] | None:
    """The metrics the task's evaluation returns (``loss`` included): its own ``metrics``,
    else its objective's; ``None`` when neither says (a task with its own ``evaluate``).
    Torch is imported only to ask an objective (a task that declares ``metrics`` needs none)."""
    declared = getattr(task, "metrics", None)
    if declared is None:
        evaluate = getattr(type(task), "evaluate", None)
        if not getattr(evaluate, "__module__", "").startswith("fedweave."):
            return None  # its own evaluate(): it may return anything
        from fedweave.learning.training import objective_of

        declared = getattr(objective_of(task), "metrics", None)
    return tuple(declared) if declared is not None else None


def headline_metric(task: object, select_metric: str = "loss") -> str:
    """The metric a run leads with on its console lines, closing line and report, chosen once:
    ``--select-metric`` when it names one other than the loss, else the objective's headline
    (``accuracy`` for classification, ``mae`` for a regression, ``f1`` for multi-label)."""
    if select_metric != "loss":
        return select_metric.rsplit(".", 1)[-1]
    return str(getattr(getattr(task, "objective", None), "headline", "accuracy"))
