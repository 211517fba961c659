"""A site's own column names mapped to its task's: ``fedweave client --columns map.toml``.

::

    # map.toml: this site's header = the task's column
    [columns]
    BMI = "bmi"
    "Disease progression" = "progression"

The map renames a file's headers before the task reads it by name (before a task's declared
``aliases``); it stays at the site and is not pinned in the run. A bad map is one line, before
anything connects (``read_column_map``; the checks against a file in ``tables.py``).
"""

from __future__ import annotations

from pathlib import Path

import tomllib

from fedweave.errors import UserError

MAX_MAP_BYTES = 1 << 20
"""A column map is a few lines; a larger file is refused unread."""


class ColumnMap(dict):
    """A site's column map: this site's header -> the task's column, with ``source``, the
    file it was read from (for messages)."""

    def __init__(self, headers: dict[str, str], source: str) -> None:
        super().__init__(headers)
        self.source = source


def read_column_map(path: str | Path) -> ColumnMap:
    """The ``[columns]`` table of ``path``: this site's header -> the task's column."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"column map {path} does not exist; pass --columns with a .toml file")
    if path.stat().st_size > MAX_MAP_BYTES:
        raise UserError(f"column map {path} is over {MAX_MAP_BYTES // 1024} KiB; a map is a "
                        "few lines of header = \"column\"")  # fmt: skip
    try:
        parsed = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(
            f"cannot read column map {path} ({exc.strerror or exc}); check its permissions"
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"column map {path} is not valid TOML ({exc}); fix the file") from None
    table = parsed.get("columns")
    if not isinstance(table, dict) or not table:
        raise UserError(
            f"column map {path} has no [columns] table; write one line per renamed header "
            'under [columns], e.g. BMI = "bmi"'
        )
    mapped: dict[str, str] = {}
    seen: dict[str, str] = {}
    for header, column in table.items():
        if not isinstance(column, str) or not column:
            raise UserError(
                f"column map {path}: '{header}' maps to {column!r}, not a column name; write "
                f'{header} = "task_column"'
            )
        if column in seen:
            raise UserError(
                f"column map {path} maps both '{seen[column]}' and '{header}' to column "
                f"'{column}'; keep one"
            )
        seen[column] = header
        mapped[str(header).strip()] = column
    return ColumnMap(mapped, str(path))
