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


def task_describe(
    name: Annotated[str, typer.Argument(help="A task name (fedweave task list) or module:attr.")],
    fmt: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
) -> None:
    """Describe one task as this machine has it: where it comes from (package and version),
    its objective and headline metric, its training defaults and, for a table task, its
    columns (kinds, bounds, aliases, categories), label and schema digest: what a site
    compares with a run's before it takes part."""
    import json
    from dataclasses import asdict

    from fedweave.errors import UserError
    from fedweave.learning.task import training_defaults
    from fedweave.learning.task_packages import pinned_package
    from fedweave.learning.tasks import load_task
    from fedweave.learning.training import objective_of

    if fmt not in ("text", "json"):
        raise UserError(f"--format {fmt!r} is unknown: use text or json")
    task = load_task(name)
    objective = objective_of(task)
    pinned = pinned_package(name)
    described: dict = {
        "task": name,
        "package": f"{pinned['package']} {pinned['version']}" if pinned else None,
        "objective": objective.name,
        "headline": objective.headline,
        "metrics": list(objective.metrics),
        "training_defaults": asdict(training_defaults(task)),
    }
    schema = getattr(task, "schema", None)
    if schema is not None and hasattr(schema, "pinned"):
        described["schema"] = {**schema.pinned(), "digest": schema.digest()}
        aliases = {c.name: list(c.aliases) for c in (*schema.features, schema.label) if c.aliases}
        described["aliases"] = aliases
    if fmt == "json":
        typer.echo(json.dumps(described, indent=2))
        return
    typer.echo(f"task {name}" + (f" ({described['package']})" if pinned else ""))
    typer.echo(f"objective {described['objective']}: metrics {', '.join(described['metrics'])}; "
               f"headline {described['headline']}")  # fmt: skip
    defaults = described["training_defaults"]
    typer.echo("training defaults: " + ", ".join(f"{k} {v}" for k, v in defaults.items()))
    if "schema" not in described:
        return
    pinned_schema = described["schema"]
    typer.echo(f"schema {pinned_schema['digest']}, columns in model-input order:")
    for column in pinned_schema["features"]:
        extra = [f"bounds {column['bounds']}"] if "bounds" in column else []
        extra += ["imputed"] if column.get("impute") else []
        extra += [f"categories {column['categories']}"] if "categories" in column else []
        extra += [f"aliases {described['aliases'][column['name']]}"] if column["name"] in \
            described["aliases"] else []  # fmt: skip
        typer.echo(f"  {column['name']}  {column['kind']}" + (f"  ({'; '.join(extra)})"
                                                            if extra else ""))  # fmt: skip
    label = pinned_schema["label"]
    classes = f", classes {label['classes']}" if label["classes"] else ""
    typer.echo(f"label {label['name']}: {label['kind']}{classes}")
