"""The run config as the history stores it, and the one policy for merging it on ``--resume``.

Policy: a resumed run computes what it started to compute. Settings marked ``identity`` (task,
split, training, strategy, privacy, ...) come from the stored run; one the user set explicitly
(flag, environment or config file) to a different value is refused with the conflict named.
Every other setting (device, database, timeouts, where to listen) comes from the resuming
command, so a run can move to another machine or GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedweave.config.commands import Resolved
from fedweave.config.files import to_toml
from fedweave.config.run_config import SETTINGS, RunConfig, coerce
from fedweave.config.sections import COMMAND_SETTINGS, PRIVACY_SETTINGS_APPLYING
from fedweave.errors import UserError


def stored_run_config(config: RunConfig, command: str) -> dict[str, Any]:
    """What the history keeps as a run's config: the command and its stored settings (of the
    privacy settings, only those its ``--dp`` mechanism uses)."""
    unused = {name for names in PRIVACY_SETTINGS_APPLYING.values() for name in names}
    unused -= set(PRIVACY_SETTINGS_APPLYING.get(config.privacy.dp, ()))
    names = [name for name in COMMAND_SETTINGS[command] if name not in unused]
    return {"command": command, "settings": config.stored(names)}


def _legacy_command(stored: dict[str, Any]) -> str:
    return "coordinator" if stored.get("mode") == "deployment" else "simulate"


def stored_settings(stored: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """(command, field name → value) of a stored run config, including the flat form that
    runs recorded before the one-config redesign kept."""
    stored = stored or {}
    if "settings" in stored:
        flat = {k: v for table in stored["settings"].values() for k, v in table.items()}
        command = str(stored.get("command", "simulate"))
    else:
        command = _legacy_command(stored)
        flat = {k: v for k, v in stored.items() if k in SETTINGS}
    taken = set(COMMAND_SETTINGS.get(command, ()))
    values = {
        name: coerce(SETTINGS[name], value, f"stored config {name}")
        for name, value in flat.items()
        if name in taken and value is not None
    }
    return command, values


def config_as_toml(run) -> str:
    """The run's config as TOML that reruns it (``fedweave COMMAND --config FILE``)."""
    command, values = stored_settings(run.config)
    tables: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if SETTINGS[name].meta.stored:
            text_safe = str(value) if isinstance(value, Path) else value
            tables.setdefault(SETTINGS[name].section, {})[name] = text_safe
    header = f"# run {run.run_id}: `fedweave {command} --config THIS_FILE` runs it again"
    return to_toml(tables, header)


def merge_for_resume(run, given: RunConfig, resolved: Resolved) -> RunConfig:
    """The config to continue ``run`` with (see the module docstring for the policy)."""
    if run.mode != "federated":
        raise UserError(
            f"run {run.run_id} is a {run.mode} run; only federated runs resume (a gossip peer "
            "rejoins by starting again)"
        )
    if run.status == "completed":
        raise UserError(
            f"run {run.run_id} already completed {run.rounds_completed} rounds; nothing to resume"
        )
    command, stored = stored_settings(run.config)
    if command != resolved.command:
        raise UserError(
            f"run {run.run_id} was started by `fedweave {command}`; resume it with that command"
        )
    kept = {name: value for name, value in stored.items() if SETTINGS[name].meta.identity}
    conflicts = [
        f"{SETTINGS[name].flag} {given.value(name)} (run has {kept[name]})"
        for name in sorted(resolved.explicit)
        if name in kept and kept[name] != given.value(name)
    ]
    if conflicts:
        raise UserError(
            f"cannot resume run {run.run_id} with a different config: {'; '.join(conflicts)}; "
            "drop those flags to continue it as it was"
        )
    recorded_dir = stored.get("checkpoint_dir")
    if recorded_dir is not None and "checkpoint_dir" not in resolved.explicit:
        kept["checkpoint_dir"] = recorded_dir  # its checkpoints and the sites' DP ledgers
    return given.replace(**kept)
