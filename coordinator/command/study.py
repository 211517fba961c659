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

import sys

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


def resolve_study(coordinator: RunConfig, text: str, source: str) -> tuple[RunConfig, Resolved]:
    """The run config of the study ``text`` (TOML; ``source`` names it in errors), served as
    ``coordinator`` serves: its own sections from ``coordinator``, the study's from ``text``
    over the defaults. ``UserError`` with one line for anything a study may not say."""
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
    names = COMMAND_SETTINGS[COMMAND]
    served = {
        name: coordinator.value(name)
        for name in names
        if SETTINGS[name].section not in STUDY_SECTIONS and name not in NOT_SERVED
    }
    config = RunConfig().replace(**served, **values)
    where = {name: f"{source}: [{SETTINGS[name].section}] {name}" for name in values}
    check_settings(config, COMMAND, where)
    explicit = frozenset(values) | frozenset(served)
    config = apply_task_defaults(config, explicit, set(names))
    return config, Resolved(COMMAND, explicit)
