"""How one option is declared: a dataclass field whose metadata carries its help and limits.

Every option of every command is one ``setting(...)`` in ``fedweave/config/sections.py``; the
command-line flags, the config-file keys, validation and the stored run config all read it
from there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Meta:
    """What a setting's metadata says.

    Attributes:
        help: one line for ``--help`` (choices and limits are appended automatically).
        choices: the only accepted values (strings), or None.
        minimum / maximum: inclusive bounds for numbers, or None.
        above: exclusive lower bound for numbers (``alpha > 0``), or None.
        below: exclusive upper bound for numbers (``stragglers < 1``), or None.
        minimum_in: a stricter inclusive lower bound in some commands, as (command, bound)
            pairs (``setting`` takes a dict: ``--rounds`` is at least 1 where rounds run to
            an end, 0 for a gossip peer that runs until stopped).
        identity: part of what a run computes; ``--resume`` keeps the stored value and refuses
            a contradicting one (False: where or how it runs, taken from the resuming command).
        stored: kept in the history with the run (False for secrets and one-off switches).
        required: a command that takes it needs a value (from a flag or the config file).
        envvar: environment variable read when the flag is absent.
        hidden: left out of ``--help`` (test and launcher plumbing).
    """

    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    below: float | None = None
    minimum_in: tuple[tuple[str, float], ...] = ()
    identity: bool = True
    stored: bool = True
    required: bool = False
    envvar: str | None = None
    hidden: bool = False

    def minimum_for(self, command: str | None) -> float | None:
        """The inclusive lower bound in ``command`` (``minimum_in``, else ``minimum``)."""
        return dict(self.minimum_in).get(command, self.minimum) if command else self.minimum


def setting(default: Any, help: str, **meta: Any) -> Any:
    """A config field: ``default`` plus its ``Meta`` (see there for the keywords)."""
    if "minimum_in" in meta:
        meta["minimum_in"] = tuple(sorted(meta["minimum_in"].items()))
    info = Meta(help=help, **meta)
    if isinstance(default, (list, dict)):
        raise TypeError("settings take immutable defaults")
    return dataclasses.field(default=default, metadata={"fedweave": info})


def meta_of(field: dataclasses.Field) -> Meta:
    return field.metadata["fedweave"]


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")
