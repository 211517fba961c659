"""Typer commands for gossip mode: ``peer`` and the ``keys`` sub-app (``keys new``).

Only typer is imported at module level: ``fedweave --help`` must not pay for torch or pyzmq.
The top-level CLI mounts ``peer`` as ``fedweave peer`` and ``keys_app`` as ``fedweave keys``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedweave.config import Resolved, RunConfig, config_command

keys_app = typer.Typer(
    help="CURVE key pairs for encrypted, authenticated gossip.", no_args_is_help=True
)


def _setup_logging(level: str) -> None:
    import logging

    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # a fresh history database's migrations are not the operator's business (15 lines)
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.root.level))


def _peer(config: RunConfig, _resolved: Resolved) -> None:
    # the options' rules (--compress fp16 or int8, --keys without --insecure) ran as they
    # were resolved, before anything starts
    _setup_logging(config.peer.log_level)
    from fedweave.gossip.peer import run_peer

    if config.peer.threads > 0:
        import torch

        torch.set_num_threads(config.peer.threads)
    code = run_peer(config)
    if code:
        raise typer.Exit(code)


peer = config_command(
    "peer",
    _peer,
    """Run a gossip peer: join via a seed, then train, exchange and mix each round.

    Example:

        fedweave peer --listen tcp://0.0.0.0:7000 --seeds tcp://siteA:7000 --data site.npz
    """,
)


@keys_app.command("new")
def keys_new(
    out: Annotated[
        Path, typer.Option(help="Directory for peer.key, peer.key_secret and allowed/.")
    ],
    force: Annotated[bool, typer.Option(help="Overwrite an existing key pair.")] = False,
) -> None:
    """Make a CURVE key pair; share peer.key with the peers that should accept you."""
    from fedweave.gossip.keys import new_keys

    identity = new_keys(out, force=force)
    typer.echo(f"peer id {identity.peer_id}")
    typer.echo(
        f"public key {out / 'peer.key'}  (give it to the other sites: there, `fedweave keys "
        "allow peer.key --keys DIR` puts it into DIR/allowed/)"
    )
    typer.echo(f"secret key {out / 'peer.key_secret'}  (keep it here)")


@keys_app.command("allow")
def keys_allow(
    files: Annotated[
        list[Path],
        typer.Argument(help="Other sites' public key files (their peer.key).", show_default=False),
    ],
    keys: Annotated[
        Path, typer.Option(help="This site's key directory (the peer's --keys).")
    ] = Path("peer-keys"),
) -> None:
    """Accept other peers: copy each public key into KEYS/allowed/<peer id>.key (one file per
    peer, whatever the file was called); a running peer reads them when it starts."""
    from fedweave.errors import user_errors_as_one_line
    from fedweave.gossip.keys import allow_key

    with user_errors_as_one_line():
        for path in files:
            peer_id, target, new = allow_key(keys, path)
            typer.echo(f"{'allowed' if new else 'already allowed'} peer {peer_id} ({target})")
