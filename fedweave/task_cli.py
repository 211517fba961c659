"""``fedweave task list`` and ``fedweave task describe``: the tasks this machine can run, built
in and installed as packages (``fedweave/learning/task_packages.py``), and one task as this
machine has it, down to its model's tensors in gossip wire order (gossip/PROTOCOL.md §3.2)."""

from __future__ import annotations

from typing import Annotated

import typer

task_app = typer.Typer(
    help="Tasks: those installed here (list), and one task as this machine has it (describe: "
    "its package, objective, columns, and its model on the gossip wire).",
    no_args_is_help=True,
)


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
    name: Annotated[
        str | None, typer.Argument(help="A task name (fedweave task list) or module:attr.")
    ] = None,
    task_option: Annotated[
        str | None, typer.Option("--task", help="The same as NAME (the older spelling).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
) -> None:
    """Describe one task as this machine has it: where it comes from (package and version),
    its objective and headline metric, its training defaults, for a table task its columns
    (kinds, bounds, aliases, categories), label and digest, and its model's tensors in gossip
    wire order (name, dtype, shape) with their schema hash, what another peer must send to be
    mixed with this one (gossip/PROTOCOL.md §3.2). NAME may also be given as --task NAME."""
    import json

    from fedweave.errors import UserError

    if fmt not in ("text", "json"):
        raise UserError(f"--format {fmt!r} is unknown: use text or json")
    if name and task_option and name != task_option:
        raise UserError(f"two tasks named ({name!r} and --task {task_option!r}): give one")
    if not (name or task_option):
        raise UserError("name a task: fedweave task describe NAME (fedweave task list shows them)")
    described = _described(name or task_option)
    if fmt == "json":
        typer.echo(json.dumps(described, indent=2))
        return
    for line in _text(described):
        typer.echo(line)


def _described(name: str) -> dict:
    from dataclasses import asdict

    from fedweave.gossip import wire
    from fedweave.learning.task import training_defaults
    from fedweave.learning.task_packages import pinned_package
    from fedweave.learning.tasks import load_task
    from fedweave.learning.training import objective_of
    from fedweave.learning.weights import get_named_weights

    task = load_task(name)
    objective = objective_of(task)
    pinned = pinned_package(name)
    weights = get_named_weights(task.build_model())
    specs = wire.tensor_specs(weights)
    described: dict = {
        "task": name,
        "package": f"{pinned['package']} {pinned['version']}" if pinned else None,
        "objective": objective.name,
        "headline": objective.headline,
        "metrics": list(objective.metrics),
        "training_defaults": asdict(training_defaults(task)),
        "schema": wire.schema_hash(specs),
        "parameters": int(sum(a.size for a in weights.values())),
        "tensors": specs,
    }
    schema = getattr(task, "schema", None)
    if schema is not None and hasattr(schema, "pinned"):
        described["table"] = {**schema.pinned(), "digest": schema.digest()}
        described["aliases"] = {
            c.name: list(c.aliases) for c in (*schema.features, schema.label) if c.aliases
        }
    return described


def _text(described: dict) -> list[str]:
    package = f" ({described['package']})" if described["package"] else ""
    lines = [
        f"task {described['task']}{package}",
        f"objective {described['objective']}: metrics {', '.join(described['metrics'])}; "
        f"headline {described['headline']}",
        "training defaults: "
        + ", ".join(f"{k} {v}" for k, v in described["training_defaults"].items()),
    ]
    if "table" in described:
        table = described["table"]
        lines.append(f"table digest {table['digest']}, columns in model-input order:")
        for column in table["features"]:
            extra = [f"bounds {column['bounds']}"] if "bounds" in column else []
            extra += ["imputed"] if column.get("impute") else []
            extra += [f"categories {column['categories']}"] if "categories" in column else []
            if column["name"] in described["aliases"]:
                extra.append(f"aliases {described['aliases'][column['name']]}")
            notes = f"  ({'; '.join(extra)})" if extra else ""
            lines.append(f"  {column['name']}  {column['kind']}{notes}")
        label = table["label"]
        classes = f", classes {label['classes']}" if label["classes"] else ""
        lines.append(f"label {label['name']}: {label['kind']}{classes}")
    specs = described["tensors"]
    lines.append(
        f"model: {described['parameters']:,} parameters in {len(specs)} tensors, wire order"
    )
    width = max(len(tensor_name) for tensor_name, _, _ in specs)
    lines += [f"  {n:<{width}}  {dtype}  {shape}" for n, dtype, shape in specs]
    lines.append(f"schema {described['schema']}")
    return lines
