"""A study submitted to a serving coordinator, read and checked as ``fedweave coordinator
--config`` reads its file (issue 38).

A study says what to learn and how: the ``STUDY_SECTIONS`` of the coordinator's settings
(task and data, training, federation, evaluation, SecAgg+, privacy). Where and how the
federation is served (address, TLS, site keys, history database, monitoring) is the
coordinator's own and comes from its command line; a study that sets any of it is refused,
as is one asking to resume a run. Every other check is the coordinator's: each value within
its choices and bounds, the rules across settings, the task's defaults, then the run's input
(``training_setup.check_run_input``), so a study that would fail at its turn fails when it
is submitted, with the same one line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from fedweave.config import Resolved, RunConfig
from fedweave.config.commands import check_settings
from fedweave.config.files import settings_from_tables
from fedweave.config.run_config import SETTINGS
from fedweave.config.sections import COMMAND_SETTINGS, SECTIONS
from fedweave.config.task_defaults import apply_task_defaults
from fedweave.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

COMMAND = "coordinator"
STUDY_SECTIONS = ("data", "training", "federation", "evaluation", "secure_aggregation",
                  "privacy")  # fmt: skip
"""The sections a study sets; the others are the serving coordinator's."""
NOT_SERVED = ("resume", "studies_only")
"""Serving settings a study does not take from the coordinator: a study resumes only its own
run (a coordinator stopped during it), and is the run ``--studies-only`` speaks of."""


def resolve_study(
    coordinator: RunConfig,
    text: str,
    source: str,
    run_model: Callable[[str], Path] | None = None,
) -> tuple[RunConfig, Resolved]:
    """The run config of the study ``text`` (TOML; ``source`` names it in errors), served as
    ``coordinator`` serves: its own sections from ``coordinator``, the study's from ``text``
    over the defaults. ``UserError`` with one line for anything a study may not say.

    ``run_model(run_id)``: the final model of a history run the submitting operator may read,
    as a file (``initial_model = "run:RUN_ID"``), or ``UserError``; ``None``: no run's."""
    try:
        tables = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{source} is not TOML ({exc}); fix its syntax") from None
    for section in tables:
        if section in SECTIONS and section not in STUDY_SECTIONS:
            raise UserError(
                f"{source}: [{section}] is the coordinator's, not a study's; remove it (a "
                f"study sets {', '.join(f'[{name}]' for name in STUDY_SECTIONS)})"
            )
    values = settings_from_tables(tables, source, COMMAND)
    task = values.get("task")
    if task is not None:
        _check_task_is_a_name(str(task), source)
    names = COMMAND_SETTINGS[COMMAND]
    served = {
        name: coordinator.value(name)
        for name in names
        if SETTINGS[name].section not in STUDY_SECTIONS and name not in NOT_SERVED
    }
    values.update(_given_files(values, coordinator.deployment.study_files, source, run_model))
    config = RunConfig().replace(**served, **values)
    where = {name: f"{source}: [{SETTINGS[name].section}] {name}" for name in values}
    check_settings(config, COMMAND, where)
    explicit = frozenset(values) | frozenset(served)
    config = apply_task_defaults(config, explicit, set(names))
    _check_bounds(config, coordinator, source)
    return config, Resolved(COMMAND, explicit)


STUDY_FILES = ("test_data", "initial_model")
"""The settings by which a study names a file: each must be in ``--study-files``."""
RUN_MODEL_PREFIX = "run:"
"""``initial_model = "run:RUN_ID"``: start from that history run's final model."""


def _given_files(
    values: dict, folder: Path | None, source: str, run_model: Callable[[str], Path] | None
) -> dict[str, Path]:
    """The files a study names (``STUDY_FILES``), each resolved inside the coordinator's
    ``--study-files`` folder (links followed), or an initial model named by its run
    (``run_model``); ``UserError`` for any other, in words that say nothing of whether or
    what it is."""
    found = {}
    for name in STUDY_FILES:
        if values.get(name) is None:
            continue
        given = str(values[name])
        if name == "initial_model" and given.startswith(RUN_MODEL_PREFIX):
            if run_model is None:
                raise UserError(
                    f"{source}: [training] initial_model names a run, which only a study "
                    "submitted to a serving coordinator may; name a file of --study-files"
                )
            found[name] = run_model(given[len(RUN_MODEL_PREFIX) :])
            continue
        refused = UserError(
            f"{source}: [{SETTINGS[name].section}] {name} is not a file this coordinator gives "
            "studies (--study-files); name one of those files, by its name in that folder"
        )
        if folder is None:
            raise refused
        root = Path(os.path.realpath(folder))
        path = Path(os.path.realpath(root / Path(values[name])))
        if path == root or not path.is_relative_to(root):
            raise refused
        found[name] = path
    return found


def _check_task_is_a_name(task: str, source: str) -> None:
    """Refuse a study's task that is not the name of a built-in task or of an installed task
    package: a study is data, and nothing it says is imported, looked up or called."""
    from fedweave.learning.task_packages import installed_tasks
    from fedweave.learning.tasks import BUILTIN_TASKS

    if task in BUILTIN_TASKS or task in installed_tasks():
        return
    if task.startswith("synthetic-") and ":" not in task and "." not in task:
        return
    known = ", ".join([*sorted(BUILTIN_TASKS), *sorted(installed_tasks())])
    raise UserError(
        f"{source}: [data] task names no task this federation installed; a study names a "
        f"built-in task or an installed task package ({known}), never an import path"
    )


STUDY_BOUNDS = (
    ("rounds", "study_max_rounds"),
    ("local_epochs", "study_max_local_epochs"),
    ("batch_size", "study_max_batch_size"),
    ("round_timeout", "study_max_round_timeout"),
    ("num_workers", "study_max_workers"),
)
"""A study's setting → the coordinator's setting that bounds it (``--study-max-...``)."""


def _check_bounds(config: RunConfig, coordinator: RunConfig, source: str) -> None:
    """Refuse a study whose settings exceed the coordinator's bounds for studies."""
    for name, bound in STUDY_BOUNDS:
        value, most = config.value(name), coordinator.value(bound)
        if value is not None and value > most:
            raise UserError(
                f"{source}: [{SETTINGS[name].section}] {name} = {value:g} is over this "
                f"coordinator's bound for studies, {most:g} ({SETTINGS[bound].flag}); ask for "
                "less, or ask the coordinator's administrator"
            )
