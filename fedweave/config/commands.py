"""Which command takes which settings, and the Typer commands built from them.

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
from fedweave.config.run_config import SETTINGS, RunConfig, check_value
from fedweave.config.sections import SECTIONS
from fedweave.errors import UserError

_TRAINING = ("rounds", "local_epochs", "lr", "batch_size", "seed", "device")
_SPLIT = ("task", "clients", "partition", "alpha", "shards_per_client")
_FEDERATION = ("clients_per_round", "strategy", "proximal_mu", "max_update_norm")
_SECAGG = ("secure_agg", "secagg_timeout")
_PRIVACY = ("dp", "noise_multiplier", "clipping_norm", "dp_epsilon", "dp_delta")

COMMAND_SETTINGS: dict[str, tuple[str, ...]] = {
    "simulate": (
        "mode", *_SPLIT, *_TRAINING, *_FEDERATION, *_SECAGG, *_PRIVACY,
        "fanout", "mix", "group_exchange", "round_interval", "exchange_timeout", "kill",
        "gpus_per_client", "gpus_per_peer", "out", "db", "checkpoint_dir", "resume", "track",
        "verbose",
    ),
    "coordinator": (
        "task", "test_data", *_TRAINING, "min_clients", *_FEDERATION, *_SECAGG, *_PRIVACY,
        "address", "insecure", "tls_dir", "require_registered_sites", "site_timeout",
        "state_dir", "once", "db", "checkpoint_dir", "resume",
    ),
    "client": (
        "coordinator", "task", "data", "label_column", "device", "insecure", "ca_cert",
        "site_key", "connect_timeout", "runtime_port", "log_file", "verbose",
    ),
    "peer": (
        "listen", "advertise", "seeds", "task", "data", "label_column", "test_data", *_TRAINING,
        "fanout", "mix", "clip_tau", "trim_fraction", "group_exchange", "round_interval",
        "exchange_timeout", "drop_after", "max_message_mb", "wait_for_peers", "linger",
        "connect_timeout", "keys", "threads", "log_level", "db",
        "run_id", "results", "dump_models", "vector", "vector_examples",
    ),
    "data split": (*_SPLIT, "seed"),
}  # fmt: skip
"""Command → the settings it takes; ``tests/test_config.py`` holds every command to it."""

CONFIG_FILE_HELP = (
    "TOML file of settings, one table per section, as `fedweave history show RUN --config` "
    "prints them; flags given here override it."
)


@dataclass(frozen=True)
class Resolved:
    """Where a command's settings came from.

    Attributes:
        command: the command's name (``simulate``, ``coordinator``, ...).
        names: the settings the command takes.
        explicit: settings the user set, on the command line, in the environment or in the
            config file (a resume refuses explicit values that contradict the stored run).
        config_file: the ``--config`` file, if one was given.
    """

    command: str
    names: tuple[str, ...]
    explicit: frozenset[str]
    config_file: Path | None


def _panel(section: str) -> str:
    return section.replace("_", " ").capitalize()


def _option(name: str) -> inspect.Parameter:
    setting = SETTINGS[name]
    meta = setting.meta
    help_text = meta.help
    if meta.choices and not all(choice in help_text for choice in meta.choices):
        help_text += f" One of: {', '.join(meta.choices)}."
    kind = setting.base_type
    if kind is bool:
        decls = [meta.flag or f"{setting.flag}/--no-{setting.flag[2:]}"]
    else:
        decls = [meta.flag or setting.flag]
    option = typer.Option(
        setting.default,
        *decls,
        help=help_text,
        envvar=meta.envvar,
        hidden=meta.hidden,
        show_default=setting.default is not None,
        rich_help_panel=_panel(setting.section),
    )
    annotation = setting.type if kind is not bool else bool
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation
    )


def resolve(
    command: str, names: Sequence[str], ctx: click.Context, given: dict[str, Any],
    config_file: Path | None,
) -> tuple[RunConfig, Resolved]:
    """Defaults < config file < environment < command line, each value checked once."""
    from_file = read_config_file(config_file, command, names) if config_file else {}
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
    for name in names:
        setting = SETTINGS[name]
        value = config.value(name)
        check_value(setting, value, where.get(name, setting.flag))
        if setting.meta.required and value in (None, ""):
            raise UserError(
                f"{setting.flag} is required (or [{setting.section}] {name} in --config)"
            )
    return config, Resolved(command, tuple(names), frozenset(explicit), config_file)


def config_command(
    command: str, body: Callable[[RunConfig, Resolved], Any], doc: str
) -> Callable[..., Any]:
    """A Typer command function for ``command``: ``--config`` plus one flag per setting."""
    names = COMMAND_SETTINGS[command]

    def run(ctx: typer.Context, config: Path | None = None, **given: Any) -> Any:
        resolved_config, resolved = resolve(command, names, ctx, given, config)
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
