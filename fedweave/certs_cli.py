"""``fedweave certs init|renew`` and ``fedweave sites new-key|add-key``: TLS and site keys.

Mounted in ``fedweave/cli.py`` as ``app.add_typer(certs_app, name="certs")`` and
``app.add_typer(sites_app, name="sites")``. Imports only ``cryptography`` (via
``fedweave.certs``) when a command runs, so ``fedweave --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

certs_app = typer.Typer(
    help="TLS for the coordinator: a CA and a server certificate.", no_args_is_help=True
)
sites_app = typer.Typer(
    help="Site authentication: key pairs for sites, registration at the coordinator.",
    no_args_is_help=True,
)


HostOption = Annotated[
    list[str],
    typer.Option("--host", help="Name or IP sites use to reach the coordinator (repeatable)."),
]
DaysOption = Annotated[int, typer.Option(help="Server certificate validity in days.")]


@certs_app.command("init")
def certs_init(
    out: Annotated[
        Path, typer.Option("--out", help="Directory for ca.pem, ca.key, server.pem, server.key.")
    ],
    host: HostOption,
    days: DaysOption = 825,
    force: Annotated[bool, typer.Option("--force", help="Replace existing files.")] = False,
) -> None:
    """Make a CA and a server certificate. Give sites ca.pem; keep ca.key offline."""
    from fedweave.certs import init_certificates

    files = init_certificates(out, host, days=days, force=force)
    typer.echo(
        f"wrote {files.ca_cert} (give to sites: --ca-cert), {files.server_cert}, "
        f"{files.server_key} (0600); start the coordinator with --tls-dir {out}"
    )


@certs_app.command("renew")
def certs_renew(
    directory: Annotated[
        Path, typer.Option("--dir", help="The directory `certs init` wrote (with ca.key).")
    ],
    host: HostOption,
    days: DaysOption = 825,
) -> None:
    """Issue a new server certificate and key with the same CA: sites keep their ca.pem."""
    from fedweave.certs import renew_server_certificate

    files = renew_server_certificate(directory, host, days=days)
    typer.echo(
        f"wrote {files.server_cert} and {files.server_key} (0600), signed by {files.ca_cert} "
        "(sites keep it); restart the coordinator (--resume continues a run)"
    )


@sites_app.command("new-key")
def sites_new_key(
    out: Annotated[
        Path, typer.Option("--out", help="Private key file to write (its .pub beside it).")
    ] = Path("site.key"),
    force: Annotated[bool, typer.Option("--force", help="Replace existing files.")] = False,
) -> None:
    """Make this site's key pair: keep site.key here, send site.pub to the coordinator."""
    from fedweave.certs import new_site_key

    private, public = new_site_key(out, force=force)
    typer.echo(
        f"wrote {private} (0600; use: fedweave client --site-key {private}) and {public} "
        f"(send it to the coordinator's operator: fedweave sites add-key DIR {public.name})"
    )


@sites_app.command("add-key")
def sites_add_key(
    directory: Annotated[Path, typer.Argument(help="The coordinator's --tls-dir.")],
    public_key: Annotated[Path, typer.Argument(help="The site's .pub file.")],
    name: Annotated[
        str | None, typer.Option(help="Name to register it under (default: file stem).")
    ] = None,
) -> None:
    """Register a site's public key; a running coordinator admits it within seconds."""
    from fedweave.certs import add_site_key

    target = add_site_key(directory, public_key, name)
    typer.echo(
        f"registered {target.stem} ({target}); a running coordinator admits it within seconds"
    )


@sites_app.command("list")
def sites_list(
    directory: Annotated[Path, typer.Argument(help="The coordinator's --tls-dir.")],
) -> None:
    """List the site keys: registered (admitted) and revoked, with their fingerprints."""
    from fedweave.certs import site_keys_table

    rows = site_keys_table(directory)
    if not rows:
        typer.echo(f"no site keys in {directory}; add one with `fedweave sites add-key`")
        return
    width = max(len(name) for name, _, _ in rows)
    for name, state, fingerprint in rows:
        typer.echo(f"{name:<{width}}  {state:<10}  {fingerprint}")


@sites_app.command("remove-key")
def sites_remove_key(
    directory: Annotated[Path, typer.Argument(help="The coordinator's --tls-dir.")],
    name: Annotated[str, typer.Argument(help="The site's name (see `fedweave sites list`).")],
) -> None:
    """Revoke a site's key: a running coordinator disconnects and refuses it within a second."""
    from fedweave.certs import remove_site_key

    target = remove_site_key(directory, name)
    typer.echo(
        f"revoked {name} (key moved to {target}); a running coordinator disconnects and "
        "refuses it within a second"
    )
