"""The task's own training defaults fill the training settings a run does not give.

A CNN wants another learning rate than a logistic regression, so the generic defaults in
``sections.py`` are only the fallback: a value from the command line, the environment or a
config file always wins, and whatever the task declares (``TrainingDefaults``) comes next.
"""

from __future__ import annotations

from collections.abc import Set

from fedweave.config.run_config import RunConfig

TASK_DEFAULTED = ("local_epochs", "optimizer", "lr", "weight_decay", "clip_grad_norm", "batch_size")
"""Training settings a task may declare a default for (``TrainingDefaults`` fields)."""


def apply_task_defaults(config: RunConfig, explicit: Set[str], names: Set[str]) -> RunConfig:
    """``config`` with the task's defaults for each of ``TASK_DEFAULTED`` in ``names`` (the
    command's settings) that is not in ``explicit`` (given by the user)."""
    wanted = [name for name in TASK_DEFAULTED if name in names and name not in explicit]
    if not wanted or "task" not in names:
        return config
    from fedweave.learning.task import training_defaults
    from fedweave.learning.tasks import load_task

    defaults = training_defaults(load_task(config.data.task))
    return config.replace(**{name: getattr(defaults, name) for name in wanted})
