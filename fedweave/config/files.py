"""Config files: TOML in, TOML out, with one-line errors naming the file, the key and what
was expected."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedweave.config.run_config import SETTINGS, coerce
from fedweave.config.sections import COMMAND_SETTINGS, SECTIONS
from fedweave.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def read_config_file(path: Path, command: str) -> dict[str, Any]:
    """Field name → value from ``path``: ``[section]`` tables of settings ``command`` takes."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"config file {path} not found; check the --config path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read config file {path} ({exc}); check the file") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"config file {path} is not TOML ({exc}); fix its syntax") from None
    return settings_from_tables(raw, str(path), command)


def settings_from_tables(tables: Mapping[str, Any], source: str, command: str) -> dict[str, Any]:
    """Check ``{section: {field: value}}`` against the declarations and ``command``'s
    settings; return field name → value of the setting's type."""
    taken = set(COMMAND_SETTINGS[command])
    values: dict[str, Any] = {}
    for section, table in tables.items():
        if section not in SECTIONS:
            raise UserError(
                f"{source}: unknown section [{section}]; sections are {', '.join(SECTIONS)}"
            )
        if not isinstance(table, Mapping):
            raise UserError(f"{source}: {section} must be a [{section}] table of settings")
        for key, value in table.items():
            setting = SETTINGS.get(key)
            where = f"{source}: [{section}] {key}"
            if setting is None or setting.section != section:
                known = [n for n, s in SETTINGS.items() if s.section == section]
                raise UserError(f"{where} is unknown; [{section}] takes {', '.join(known)}")
            if key not in taken:
                raise UserError(f"{where} is not a setting of `fedweave {command}`; remove it")
            values[key] = coerce(setting, value, where)
    return values


def to_toml(tables: Mapping[str, Mapping[str, Any]], header: str = "") -> str:
    """``{section: {field: value}}`` as TOML, sections in declaration order."""
    import tomli_w

    ordered = {s: dict(tables[s]) for s in SECTIONS if tables.get(s)}
    text = tomli_w.dumps(ordered)
    return (header + "\n" if header else "") + text
