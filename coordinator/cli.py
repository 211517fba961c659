"""``fedweave coordinator``: the server side of a real deployment (Flower SuperLink + our
ServerApp). Mounted in ``fedweave/cli.py`` as ``app.command()(coordinator)``.

Only Typer is imported at module level, so ``fedweave --help`` does not load Flower or torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
import typer


def coordinator(
    ctx: typer.Context,
    address: Annotated[
        str, typer.Option(help="HOST:PORT sites connect to (0.0.0.0 for all interfaces).")
    ] = "0.0.0.0:9092",
    task: Annotated[
        str, typer.Option(help="Task name or module:attr; every site must hold the same task.")
    ] = "digits",
    rounds: Annotated[int, typer.Option(help="Rounds of the run.")] = 20,
    min_clients: Annotated[
        int, typer.Option(help="Sites that must be connected before a round starts.")
    ] = 3,
    clients_per_round: Annotated[
        int, typer.Option(help="Sites sampled per round (0: all --min-clients).")
    ] = 0,
    local_epochs: Annotated[int, typer.Option(help="Local epochs per round at each site.")] = 1,
    lr: Annotated[float, typer.Option(help="Sites' SGD learning rate.")] = 0.1,
    batch_size: Annotated[int, typer.Option(help="Sites' batch size.")] = 16,
    seed: Annotated[
        int, typer.Option(help="Seeds the initial model and the sites' shuffling.")
    ] = 0,
    secure_agg: Annotated[
        bool,
        typer.Option(
            "--secure-agg/--no-secure-agg",
            help="SecAgg+: the coordinator only sees the sum of the sites' updates "
            "(needs 3+ sites per round).",
        ),
    ] = True,
    db: Annotated[
        str | None,
        typer.Option(
            envvar="FEDWEAVE_DB", help="History database URL (default sqlite:///fedweave.db)."
        ),
    ] = None,
    tls_dir: Annotated[
        Path | None,
        typer.Option(
            help="Directory from `fedweave certs init` (ca.pem, server.pem, server.key, sites/)."
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option("--insecure", help="Serve without TLS (testing only; TLS is on by default)."),
    ] = False,
    require_registered_sites: Annotated[
        bool,
        typer.Option(
            "--require-registered-sites",
            help="Refuse sites whose key was not added with `fedweave sites add-key`.",
        ),
    ] = False,
    resume: Annotated[
        str | None,
        typer.Option(help="Continue this run id (or 'latest') after its last recorded round."),
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="Exit (0) when the run completes instead of serving on.")
    ] = False,
    test_data: Annotated[
        Path | None,
        typer.Option(
            help="Held-out .npz for central evaluation (default: the task's own test split)."
        ),
    ] = None,
    checkpoint_dir: Annotated[
        Path, typer.Option(help="Where per-round model checkpoints go.")
    ] = Path("checkpoints"),
    state_dir: Annotated[
        Path, typer.Option(help="Flower's persistent state (superlink.db) and log.")
    ] = Path("coordinator-state"),
    site_timeout: Annotated[
        float,
        typer.Option(
            help="Give up if --min-clients sites are not connected after this many seconds "
            "(0: wait forever)."
        ),
    ] = 0.0,
) -> None:
    """Run the coordinator: a Flower SuperLink sites connect to, and our ServerApp on top."""
    from fedweave.coordinator.deployed_run import DeployPlan
    from fedweave.coordinator.serve import CoordinatorOptions, serve

    explicit = {
        name
        for name in ctx.params
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
    }
    plan = DeployPlan(
        run_id="",
        task=task,
        rounds=rounds,
        min_clients=min_clients,
        clients_per_round=clients_per_round,
        local_epochs=local_epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        secure_agg=secure_agg,
        checkpoint_dir=str(checkpoint_dir),
        test_data=str(test_data.resolve()) if test_data else "",
    )
    code = serve(
        CoordinatorOptions(
            address=address,
            plan=plan,
            db_url=db,
            tls_dir=tls_dir,
            insecure=insecure,
            require_registered_sites=require_registered_sites,
            resume=resume,
            once=once,
            state_dir=state_dir,
            site_timeout=site_timeout or None,
            explicit=frozenset(explicit),
        )
    )
    raise typer.Exit(code)
