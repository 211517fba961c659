"""The Typer commands built from the settings each command takes (``COMMAND_SETTINGS``).

A command here is a list of setting names plus a body ``(config, resolved) -> None``. Its
flags, their defaults, help and section panels come from the declarations; ``--config FILE``
reads the same settings from TOML. Precedence: defaults < config file < environment <
command line. Every value is then checked by one function, whatever its source.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import typer

from fedweave.config.files import read_config_file
from fedweave.config.rules import check_rules
from fedweave.config.run_config import SETTINGS, RunConfig, check_value
from fedweave.config.sections import COMMAND_SETTINGS, SECTIONS
from fedweave.config.task_defaults import TASK_DEFAULTED, apply_task_defaults
from fedweave.errors import UserError

CONFIG_FILE_HELP = (
    "TOML file of settings, one table per section, as `fedweave history show RUN --config` "
    "prints them; flags given here override it."
)


@dataclass(frozen=True)
class Resolved:
    """Where a command's settings came from.

    Attributes:
        command: the command's name (``simulate``, ``coordinator``, ...).
        explicit: settings the user set, on the command line, in the environment or in the
            config file (a resume refuses explicit values that contradict the stored run).
    """

    command: str
    explicit: frozenset[str] = frozenset()

    @property
    def names(self) -> tuple[str, ...]:
        """The settings the command takes."""
        return COMMAND_SETTINGS[self.command]


def _panel(section: str) -> str:
    return section.replace("_", " ").capitalize()


def _option(name: str) -> inspect.Parameter:
    setting = SETTINGS[name]
    meta = setting.meta
    help_text = meta.help
    if meta.choices and not all(choice in help_text for choice in meta.choices):
        help_text += f" One of: {', '.join(meta.choices)}."
    kind = setting.base_type
    decl = f"{setting.flag}/--no-{setting.flag[2:]}" if kind is bool else setting.flag
    option = typer.Option(
        setting.default,
        decl,
        help=help_text,
        envvar=meta.envvar,
        hidden=meta.hidden,
        # the task declares these defaults; the help text says so
        show_default=setting.default is not None and name not in TASK_DEFAULTED,
        rich_help_panel=_panel(setting.section),
    )
    annotation = setting.type if kind is not bool else bool
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation
    )


def resolve(
    command: str, ctx: click.Context, given: dict[str, Any], config_file: Path | None
) -> tuple[RunConfig, Resolved]:
    """Defaults < config file < environment < command line, each value checked once."""
    names = COMMAND_SETTINGS[command]
    from_file = read_config_file(config_file, command) if config_file else {}
    values: dict[str, Any] = dict(from_file)
    where = {name: f"{config_file}: [{SETTINGS[name].section}] {name}" for name in from_file}
    explicit = set(from_file)
    for name in names:
        source = ctx.get_parameter_source(name)
        if source in (click.core.ParameterSource.COMMANDLINE,
                      click.core.ParameterSource.ENVIRONMENT):
            values[name] = given[name]
            where[name] = SETTINGS[name].flag
            explicit.add(name)
    config = RunConfig().replace(**values)
    check_settings(config, command, where)
    check_given_together(explicit, where)
    config = apply_task_defaults(config, explicit, set(names))
    return config, Resolved(command, frozenset(explicit))


GIVEN_APART = (
    ("target_epsilon", "noise_multiplier", "--target-epsilon sizes the noise multiplier itself"),
    ("target_epsilon", "dp_epsilon", "--target-epsilon sizes the per-round epsilon itself"),
)
"""Pairs of settings a user may not both give, each with why (one would silently win)."""


def check_given_together(explicit: set[str], where: dict[str, str]) -> None:
    """Refuse, in one line, two settings given together where one replaces the other."""
    for first, second, why in GIVEN_APART:
        if first in explicit and second in explicit:
            raise UserError(
                f"{where.get(first, SETTINGS[first].flag)} with "
                f"{where.get(second, SETTINGS[second].flag)}: {why}; give one of them"
            )


def check_settings(config: RunConfig, command: str, where: dict[str, str] | None = None) -> None:
    """Every setting ``command`` takes within its choices and bounds, the required ones given,
    then every rule across options that the command's settings take part in (``rules.py``);
    ``where`` names a value's source in the error (default: its flag). Every command that
    resolves options runs this, and so runs the same checks of each option it takes."""
    for name in COMMAND_SETTINGS[command]:
        setting = SETTINGS[name]
        value = config.value(name)
        check_value(setting, value, (where or {}).get(name, setting.flag), command)
        if setting.meta.required and value in (None, ""):
            raise UserError(
                f"{setting.flag} is required (or [{setting.section}] {name} in --config)"
            )
    check_rules(config, command)


def config_command(
    command: str, body: Callable[[RunConfig, Resolved], Any], doc: str
) -> Callable[..., Any]:
    """A Typer command function for ``command``: ``--config`` plus one flag per setting."""
    names = COMMAND_SETTINGS[command]

    def run(ctx: typer.Context, config: Path | None = None, **given: Any) -> Any:
        resolved_config, resolved = resolve(command, ctx, given, config)
        return body(resolved_config, resolved)

    params = [
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                          annotation=typer.Context),
        inspect.Parameter(
            "config", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
            default=typer.Option(None, "--config", help=CONFIG_FILE_HELP,
                                 rich_help_panel="Config file"),
        ),
        *(_option(name) for name in _ordered(names)),
    ]
    run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    run.__doc__ = doc
    run.__name__ = command.replace(" ", "_")
    return run


def _ordered(names: Sequence[str]) -> list[str]:
    """The command's settings in section order, so ``--help`` panels read top to bottom."""
    order = {section: i for i, section in enumerate(SECTIONS)}
    return sorted(names, key=lambda n: (order[SETTINGS[n].section], names.index(n)))


def option_for(name: str) -> Any:
    """The ``typer.Option`` of one setting, for a hand-written command that takes it (its
    default, flag and help still come from the one declaration)."""
    return _option(name).default
