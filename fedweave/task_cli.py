"""``fedweave task list``: the tasks this machine can run, built in and installed as packages
(``fedweave/learning/task_packages.py``)."""

from __future__ import annotations

from typing import Annotated

import typer


def task_list(
    fmt: Annotated[str, typer.Option("--format", help="text (a table) or json.")] = "text",
) -> None:
    """List the tasks --task takes here: the built-in ones and those installed task packages
    register (name, package and version, what it points to)."""
    import json

    from fedweave.errors import UserError
    from fedweave.learning.task_packages import installed_tasks
    from fedweave.learning.tasks import BUILTIN_TASKS

    if fmt not in ("text", "json"):
        raise UserError(f"--format {fmt!r} is unknown: use text or json")
    rows = [{"task": name, "package": "fedweave (built in)", "version": None, "target": target}
            for name, target in BUILTIN_TASKS.items()]  # fmt: skip
    rows += [
        {"task": t.name, "package": t.package, "version": t.version, "target": t.target}
        for t in sorted(installed_tasks().values(), key=lambda t: t.name)
    ]
    if fmt == "json":
        typer.echo(json.dumps(rows, indent=2))
        return
    width = max(len(row["task"]) for row in rows)
    for row in rows:
        package = row["package"] + (f" {row['version']}" if row["version"] else "")
        typer.echo(f"{row['task']:<{width}}  {package}  ({row['target']})")
    typer.echo("also: synthetic-A-B, synthetic-iid, or any 'module:attr' on PYTHONPATH")
