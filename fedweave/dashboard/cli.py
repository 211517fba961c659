"""``fedweave dashboard``: the live web view of a history (runs, rounds, sites, alerts) and its
Prometheus ``/metrics``; ``fedweave dashboard add-credential`` for a non-loopback one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedweave.config.commands import option_for
from fedweave.config.sections import DEFAULT_DB_URL
from fedweave.errors import user_errors_as_one_line
from fedweave.history.cli import DbOption

DEFAULT_ADDRESS = "127.0.0.1:8080"

dashboard_app = typer.Typer(
    name="dashboard",
    help="A live web page of the runs a history records (SQLite or PostgreSQL): each run's "
    "metric curves, seconds and site outcomes per round, the round in flight with its "
    "deadline, every site's record and failures with their reasons, gossip peers, runs "
    "compared on one chart, and stall alerts; /metrics for Prometheus. Read-only; loopback "
    "by default (another address needs --tls-dir and --auth-file).",
    add_completion=False,
    invoke_without_command=True,
)


@dashboard_app.callback(invoke_without_command=True)
def dashboard(
    ctx: typer.Context,
    db: DbOption = DEFAULT_DB_URL,
    address: Annotated[
        str,
        typer.Option(help="HOST:PORT to serve on; a non-loopback host needs --tls-dir and "
                     "--auth-file."),  # fmt: skip
    ] = DEFAULT_ADDRESS,
    tls_dir: Annotated[
        Path | None,
        typer.Option(help="Serve HTTPS with server.pem / server.key of this `fedweave certs "
                     "init` directory."),  # fmt: skip
    ] = None,
    auth_file: Path | None = option_for("auth_file"),
    stall_after: int = option_for("stall_after"),
    stall_grace: float = option_for("stall_grace"),
) -> None:
    """Serve the dashboard until Ctrl-C."""
    if ctx.invoked_subcommand is not None:
        return
    with user_errors_as_one_line():
        _serve(db, address, tls_dir, auth_file, stall_after, stall_grace)


def _serve(
    db: str, address: str, tls_dir: Path | None, auth_file: Path | None, stall_after: int,
    stall_grace: float,
) -> None:  # fmt: skip
    from fedweave.dashboard.app import make_app
    from fedweave.dashboard.security import exposure
    from fedweave.dashboard.server import bind, serve_forever
    from fedweave.dashboard.views import Views
    from fedweave.errors import UserError
    from fedweave.history import open_store
    from fedweave.history.alerts import AlertRules

    if stall_after < 0 or stall_grace < 0:
        raise UserError("--stall-after and --stall-grace must be 0 or more")
    serving = exposure(address, "--address", tls_dir, auth_file)
    store = open_store(db, read_only=True)  # unreachable or unmigrated: one line, exit 2
    sock = bind(serving, "--address")
    try:
        views = Views(store, AlertRules(stall_after, stall_grace))
        typer.echo(
            f"dashboard of {store.masked_url} at {serving.url}/ (read-only"
            + (", credentials required" if serving.credentials else "")
            + "); Ctrl-C to stop",
            err=True,
        )
        app = make_app(views, serving.credentials, hosts=serving.host_names,
                       certificate=serving.certfile)  # fmt: skip
        serve_forever(app, serving, sock)
    finally:
        sock.close()
        store.close()


@dashboard_app.command(
    "add-credential",
    help="Add a credential to an --auth-file and print its password once (only its scrypt "
    "hash is kept): NAME and the password for HTTP basic auth, or the password alone as a "
    "bearer token.",
)
def add_credential(
    name: Annotated[str, typer.Argument(help="Who the credential is for (e.g. prometheus).")],
    auth_file: Annotated[
        Path, typer.Option(help="The credential file to add it to (made 0600 if new).")
    ],
) -> None:
    from fedweave.dashboard.security import write_credential

    with user_errors_as_one_line():
        password = write_credential(auth_file, name)
    typer.echo(f"credential {name} added to {auth_file}; its password (shown once):")
    typer.echo(password)
