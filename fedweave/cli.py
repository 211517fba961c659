"""The `fedweave` command: the composition root that mounts each mode's subcommands.

Subcommands live beside the code they drive (``fedweave.<mode>.cli``) and import that code
lazily, so `fedweave client` never loads the coordinator's stack and `--help` stays fast. The
modes are imported only when the command table is built (``build_app``), never when
``fedweave.cli`` is imported: the core does not depend on a mode.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

import click
import typer

from fedweave.errors import user_errors_as_one_line


def version() -> None:
    """Print the fedweave version and the Flower it runs on."""
    from fedweave.versions import running

    fedweave, flower = running()
    typer.echo(f"{fedweave} (flwr {flower})")


@cache
def build_app() -> typer.Typer:
    """Every subcommand, mounted once."""
    from fedweave.certs_cli import certs_app, sites_app
    from fedweave.client.cli import client
    from fedweave.coordinator.command.cli import coordinator, evaluate
    from fedweave.dashboard.cli import dashboard_app
    from fedweave.gossip.cli import keys_app, peer
    from fedweave.history.cli import history_app, predict_command
    from fedweave.operators_cli import operators_app
    from fedweave.run_cli import run_app
    from fedweave.simulations.cli import data_app, simulate
    from fedweave.task_cli import task_app, task_describe, task_list

    app = typer.Typer(
        help="fedweave: federated (Flower + SecAgg+) and serverless gossip learning; "
        "sites keep their data.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.command()(simulate)
    app.add_typer(data_app, name="data")
    app.add_typer(history_app, name="history")
    app.add_typer(dashboard_app, name="dashboard")
    app.command("predict")(predict_command)
    app.command()(coordinator)
    app.command()(evaluate)
    app.command()(client)
    app.add_typer(certs_app, name="certs")
    app.add_typer(sites_app, name="sites")
    app.add_typer(operators_app, name="operators")
    app.add_typer(run_app, name="run")
    app.command()(peer)
    app.add_typer(keys_app, name="keys")
    task_app.command("list")(task_list)
    task_app.command("describe")(task_describe)
    app.add_typer(task_app, name="task")
    app.command()(version)
    return app


def __getattr__(name: str) -> Any:
    if name == "app":
        return build_app()
    raise AttributeError(f"module 'fedweave.cli' has no attribute {name!r}")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: user errors become one line and exit code 2, never a traceback.

    ``argv`` defaults to the process's arguments (``python -m fedweave.gossip`` passes its own).
    """
    from fedweave.offline import make_flower_offline

    make_flower_offline()  # before anything imports flwr or ray
    try:
        with user_errors_as_one_line():
            code = build_app()(args=argv, standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, click.Abort):
        typer.echo("interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
