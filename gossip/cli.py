"""Typer commands for gossip mode: ``peer`` and the ``keys`` sub-app (``keys new``).

Only typer is imported at module level: ``fedweave --help`` must not pay for torch or pyzmq.
The top-level CLI mounts ``peer`` as ``fedweave peer`` and ``keys_app`` as ``fedweave keys``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

keys_app = typer.Typer(
    help="CURVE key pairs for encrypted, authenticated gossip.", no_args_is_help=True
)


def _setup_logging(level: str) -> None:
    import logging

    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def peer(
    listen: Annotated[str, typer.Option(help="Endpoint to listen on, tcp://HOST:PORT.")],
    seeds: Annotated[
        str, typer.Option(help="Comma-separated seeds: tcp://A:P or PEERID@tcp://A:P.")
    ] = "",
    task: Annotated[str, typer.Option(help="Built-in task name or module:attr.")] = "digits",
    data: Annotated[
        Path | None, typer.Option(help="This site's data (.npz with x,y or .csv).")
    ] = None,
    test: Annotated[
        Path | None, typer.Option(help="Held-out data to evaluate each round on.")
    ] = None,
    rounds: Annotated[int, typer.Option(help="Rounds to run; 0 runs until SIGTERM.")] = 50,
    db: Annotated[
        str,
        typer.Option(
            envvar="FEDWEAVE_DB",
            help="History database URL (sqlite:///FILE or postgresql+psycopg://...); "
            "'none' records nothing.",
        ),
    ] = "sqlite:///fedweave.db",
    keys: Annotated[
        Path | None, typer.Option(help="CURVE key directory (fedweave keys new).")
    ] = None,
    fanout: Annotated[
        int, typer.Option(help="Neighbours this peer offers its model to each round.")
    ] = 4,
    mix: Annotated[str, typer.Option(help="pairwise | clipped | trimmed.")] = "pairwise",
    clip_tau: Annotated[
        float | None, typer.Option(help="ClippedGossip radius (default adaptive).")
    ] = None,
    trim_fraction: Annotated[
        float, typer.Option(help="Share trimmed at each end by 'trimmed'.")
    ] = 0.2,
    epochs: Annotated[int, typer.Option(help="Local epochs per round.")] = 1,
    batch_size: Annotated[int, typer.Option(help="Local batch size.")] = 32,
    lr: Annotated[float, typer.Option(help="Local SGD learning rate.")] = 0.05,
    device: Annotated[
        str | None, typer.Option(help="cpu, cuda, cuda:N (default: CUDA if present).")
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed; peers sharing it start from the same model.")
    ] = 0,
    exchange_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for a neighbour's reply.")
    ] = 5.0,
    connect_timeout: Annotated[
        float, typer.Option(help="Seconds to keep trying the seeds.")
    ] = 30.0,
    drop_after: Annotated[
        int, typer.Option(help="Missed deadlines before a neighbour is dropped.")
    ] = 3,
    max_message_mb: Annotated[int, typer.Option(help="Largest accepted message, MiB.")] = 1024,
    wait_for_peers: Annotated[
        int, typer.Option(help="Before round 1, wait until this many peers are known.")
    ] = 0,
    round_interval: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Slotted rounds: every round starts on a wall-clock multiple of this many "
            "seconds, so peers (clocks synced by NTP) train together and mix after; pick more "
            "than a round's training + exchanges. 0: rounds back to back.",
        ),
    ] = 0.0,
    linger: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="After the last round, keep answering other peers' offers this many seconds "
            "(slower peers can still mix with this peer's final model); Ctrl-C ends it early.",
        ),
    ] = 0.0,
    group_exchange: Annotated[
        bool, typer.Option(help="Pairwise: average with all neighbours of a round at once.")
    ] = False,
    threads: Annotated[int, typer.Option(help="torch CPU threads (0 keeps torch's default).")] = 1,
    log_level: Annotated[str, typer.Option(help="debug, info, warning.")] = "info",
    run_id: Annotated[
        str | None, typer.Option(hidden=True, help="Write into this history run.")
    ] = None,
    results: Annotated[
        Path | None, typer.Option(hidden=True, help="JSON-lines results (simulation).")
    ] = None,
    dump_models: Annotated[
        Path | None, typer.Option(hidden=True, help="Per-round model dumps.")
    ] = None,
    vector: Annotated[
        Path | None, typer.Option(hidden=True, help="Gossip a .npy vector (tests).")
    ] = None,
    vector_examples: Annotated[int, typer.Option(hidden=True, help="Weight of --vector.")] = 1,
) -> None:
    """Run a gossip peer: join via a seed, then train, exchange and mix each round."""
    _setup_logging(log_level)
    from fedweave.gossip.peer import PeerConfig, run_peer

    if threads > 0 and vector is None:
        import torch

        torch.set_num_threads(threads)
    config = PeerConfig(
        listen=listen,
        seeds=[s for s in seeds.split(",") if s.strip()],
        task=task,
        data=data,
        test=test,
        rounds=rounds,
        db=None if db.lower() == "none" else db,
        run_id=run_id,
        keys=keys,
        fanout=fanout,
        mix=mix,
        clip_tau=clip_tau,
        trim_fraction=trim_fraction,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        device=device,
        seed=seed,
        exchange_timeout=exchange_timeout,
        connect_timeout=connect_timeout,
        drop_after=drop_after,
        max_message_mb=max_message_mb,
        wait_for_peers=wait_for_peers,
        round_interval=round_interval,
        linger=linger,
        group_exchange=group_exchange,
        results=results,
        dump_models=dump_models,
        vector=vector,
        vector_examples=vector_examples,
    )
    code = run_peer(config)
    if code:
        raise typer.Exit(code)


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
    typer.echo(f"public key {out / 'peer.key'}  (copy it into other peers' allowed/)")
    typer.echo(f"secret key {out / 'peer.key_secret'}  (keep it here)")
