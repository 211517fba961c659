"""``fedweave operators add|list|remove|audit``: who may run studies on a standing federation,
and what was done (issue 38). Mounted in ``fedweave/cli.py`` as
``app.add_typer(operators_app, name="operators")``.

The operators live in the federation's history database (``--db``, as ``fedweave history``
reads it): a name and the sha256 of a token (``fedweave/history/operators.py``). Run these on
the coordinator's host, as whoever may change that database: the commands are the
administrator's own door, recorded in the audit trail under ``user@host``. Only typer is
imported at module level, so ``fedweave --help`` stays fast; every user-caused failure ends
as ``error: <one line>`` and exit code 2.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path
from typing import Annotated

import typer

from fedweave.errors import UserError, user_errors_as_one_line
from fedweave.history.cli import DbOption

operators_app = typer.Typer(
    help="Operators of a standing federation: tokens for who may submit and stop runs at "
    "the coordinator, and the audit trail of what was done.",
    no_args_is_help=True,
)


def _administrator() -> str:
    """Who runs this command, as the audit trail names them: ``user@host``."""
    from fedweave.history.liveness import this_host

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = f"uid{os.getuid()}"
    return f"{user}@{this_host()}"


def _when(moment) -> str:  # type: ignore[no-untyped-def]
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment is not None else ""


@operators_app.command("add")
def operators_add(
    name: Annotated[str, typer.Argument(help="The operator's name (letters, digits, . _ @ -).")],
    db: DbOption,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="Where to write the token (0600; default NAME.token here). It is shown "
            "nowhere else and only its sha256 is kept: give the file to the operator.",
        ),
    ] = None,
    roles: Annotated[
        str,
        typer.Option(
            "--roles",
            help="What the operator may do at the door, comma-separated: submit, read-own, "
            "read-all (every operator's studies), stop-own, stop-all, admin (everything).",
        ),
    ] = "submit,read-own,stop-own",
) -> None:
    """Make an operator and its token, written once to a 0600 file: give it to the operator."""
    from fedweave.history.cli import _open
    from fedweave.history.operators import OperatorRegistry, check_name, check_roles
    from fedweave.history.store import open_store
    from fedweave.private_files import write_private_text

    with user_errors_as_one_line():
        check_name(name)
        roles = check_roles(roles)
        target = token_file or Path(f"{name}.token")
        if target.exists():
            raise UserError(f"{target} exists; move it away or name another file with --token-file")
        if not target.parent.is_dir():
            raise UserError(f"no folder {target.parent} for the token file; create it first")
        with open_store(db) as store:  # created where it is not yet: before the first run
            token = OperatorRegistry(store).add(name, added_by=_administrator(), roles=roles)
        try:
            write_private_text(target, token + "\n")
        except OSError as exc:
            with _open(db) as store:
                OperatorRegistry(store).remove(name, removed_by=_administrator())
            raise UserError(
                f"cannot write {target} ({exc.strerror}); operator '{name}' was removed "
                "again: add it with another --token-file"
            ) from None
    typer.echo(
        f"operator {name} added with roles {roles}; its token is in {target} (0600), the only "
        "copy: give it to "
        f"{name} over a private channel (`fedweave run ... --operator-token {target.name}`)"
    )


@operators_app.command("list")
def operators_list(db: DbOption) -> None:
    """List the operators, present and removed, with who added them and when."""
    from fedweave.history.cli import _open
    from fedweave.history.operators import OperatorRegistry

    with user_errors_as_one_line():
        with _open(db) as store:
            rows = OperatorRegistry(store).operators()
    if not rows:
        typer.echo("no operators; add one with `fedweave operators add NAME`")
        return
    width = max(len(row.name) for row in rows)
    for row in rows:
        state = "active" if row.active else f"removed {_when(row.removed_at)}"
        typer.echo(
            f"{row.name:<{width}}  added {_when(row.added_at)} by {row.added_by}  {state}  "
            f"roles {','.join(sorted(row.roles))}"
        )


@operators_app.command("roles")
def operators_roles(
    name: Annotated[str, typer.Argument(help="The operator (see `fedweave operators list`).")],
    roles: Annotated[str, typer.Argument(help="Its roles from now on, comma-separated.")],
    db: DbOption,
) -> None:
    """Give an operator exactly these roles (submit, read-own, read-all, stop-own, stop-all,
    admin); the door checks them at every request."""
    from fedweave.history.cli import _open
    from fedweave.history.operators import OperatorRegistry

    with user_errors_as_one_line():
        with _open(db) as store:
            given = OperatorRegistry(store).set_roles(name, roles, changed_by=_administrator())
    typer.echo(f"operator {name} now has roles {given}")


@operators_app.command("remove")
def operators_remove(
    name: Annotated[str, typer.Argument(help="The operator (see `fedweave operators list`).")],
    db: DbOption,
) -> None:
    """Remove an operator: its token is refused from then on."""
    from fedweave.history.cli import _open
    from fedweave.history.operators import OperatorRegistry

    with user_errors_as_one_line():
        with _open(db) as store:
            OperatorRegistry(store).remove(name, removed_by=_administrator())
    typer.echo(f"operator {name} removed; its token is refused from now on")


@operators_app.command("audit")
def operators_audit(
    db: DbOption,
    limit: Annotated[int, typer.Option(min=1, help="How many of the newest entries.")] = 50,
) -> None:
    """Show the audit trail, oldest first: who did or was refused what, from where, when."""
    from fedweave.history.cli import _open
    from fedweave.history.operators import OperatorRegistry

    with user_errors_as_one_line():
        with _open(db) as store:
            rows = OperatorRegistry(store).audit(limit)
    if not rows:
        typer.echo("the audit trail is empty")
        return
    for row in rows:
        where = f" from {row.address}" if row.address else ""
        target = f" {row.target}" if row.target else ""
        detail = f": {row.detail}" if row.detail else ""
        typer.echo(
            f"{_when(row.at)}  {row.outcome:<7}  {row.actor}{where}  {row.action}{target}{detail}"
        )
