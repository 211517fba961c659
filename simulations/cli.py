"""`fedweave simulate` and `fedweave data split`: flags and help; the work is imported lazily."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from fedweave.errors import UserError


class Mode(str, Enum):
    federated = "federated"
    gossip = "gossip"


class Partition(str, Enum):
    iid = "iid"
    dirichlet = "dirichlet"
    shards = "shards"


data_app = typer.Typer(help="Prepare per-site data files.", no_args_is_help=True)

TASK_HELP = "Task to train: a built-in name (digits, mnist5k) or 'my_module:my_task'."
PARTITION_HELP = (
    "How data is split across sites: iid (uniform), dirichlet (label skew set by --alpha), "
    "shards (each site holds --shards-per-client classes)."
)
ALPHA_HELP = "Dirichlet concentration (> 0): smaller means more label skew between sites."


def _check_common(clients: int, rounds: int | None, alpha: float, partition: Partition) -> None:
    if clients < 1:
        raise UserError(f"--clients must be at least 1, got {clients}")
    if rounds is not None and rounds < 1:
        raise UserError(f"--rounds must be at least 1, got {rounds}")
    if partition is Partition.dirichlet and not alpha > 0:
        raise UserError(f"--alpha must be > 0, got {alpha}")


@data_app.command("split")
def data_split(
    task: str = typer.Option("digits", help=TASK_HELP),
    clients: int = typer.Option(10, min=1, help="Number of site files to write."),
    partition: Partition = typer.Option(Partition.iid, help=PARTITION_HELP),
    alpha: float = typer.Option(0.5, help=ALPHA_HELP),
    shards_per_client: int = typer.Option(2, help="Classes per site for --partition shards."),
    seed: int = typer.Option(0, help="Same seed, same split."),
    out: Path = typer.Option(..., help="Directory for site-<i>.npz and the held-out test.npz."),
) -> None:
    """Split a task's data into DIR/site-<i>.npz files plus a held-out DIR/test.npz."""
    from fedweave.learning.task import load_task
    from fedweave.simulations.partition import label_skew
    from fedweave.simulations.split import test_file, write_split

    _check_common(clients, None, alpha, partition)
    task_obj = load_task(task)
    paths = write_split(task_obj, out, clients, partition.value, alpha, shards_per_client, seed)
    import numpy as np

    labels = [np.load(p)["y"] for p in paths]
    all_labels = np.concatenate(labels)
    offsets = np.cumsum([0] + [len(y) for y in labels])
    parts = [np.arange(offsets[i], offsets[i + 1]) for i in range(len(labels))]
    sizes = ", ".join(str(len(y)) for y in labels)
    typer.echo(f"wrote {len(paths)} site files to {out} (examples per site: {sizes})")
    typer.echo(
        f"held-out test set: {test_file(out)}; "
        f"label skew (0 = iid): {label_skew(all_labels, parts):.3f}"
    )


def simulate(
    ctx: typer.Context,
    mode: Mode = typer.Option(
        Mode.federated, help="federated (Flower + FedAvg) or gossip (ZeroMQ peers)."
    ),
    task: str = typer.Option("digits", help=TASK_HELP),
    clients: int = typer.Option(10, help="Simulated sites (federated) or peers (gossip)."),
    rounds: int = typer.Option(20, help="Rounds of training to run."),
    clients_per_round: int | None = typer.Option(
        None, help="Federated: sites sampled each round (default: all)."
    ),
    partition: Partition = typer.Option(Partition.iid, help=PARTITION_HELP),
    alpha: float = typer.Option(0.5, help=ALPHA_HELP),
    shards_per_client: int = typer.Option(2, help="Classes per site for --partition shards."),
    local_epochs: int = typer.Option(1, min=1, help="Local epochs each site trains per round."),
    lr: float = typer.Option(0.1, min=0.0, help="Local SGD learning rate."),
    batch_size: int = typer.Option(16, min=1, help="Local batch size."),
    seed: int = typer.Option(0, help="Seeds the split, the initial model and local shuffling."),
    device: str | None = typer.Option(
        None, help="cuda, cuda:N or cpu (default: CUDA when present)."
    ),
    strategy: str = typer.Option(
        "fedavg",
        help="Federated aggregation: fedavg, fedprox, fedadam, fedyogi, or (needs --no-secure-agg) "
        "fedmedian, trimmedavg, krum, multikrum.",
    ),
    secure_agg: bool = typer.Option(
        True,
        "--secure-agg/--no-secure-agg",
        help="Federated: SecAgg+ so the coordinator only sees the sum of the sites' models "
        "(needs 3+ sites per round).",
    ),
    secagg_timeout: float = typer.Option(
        600.0,
        min=1.0,
        help="Seconds each SecAgg+ stage waits for sites; slower sites count as dropped.",
    ),
    max_update_norm: float | None = typer.Option(
        None, min=0.0, help="Reject site updates farther than this (L2) from the global model."
    ),
    dp: str = typer.Option("none", help="Differential privacy: none, central or local."),
    noise_multiplier: float = typer.Option(
        1.0, min=0.0, help="Central DP: noise std / clipping norm."
    ),
    clipping_norm: float = typer.Option(1.0, min=0.0, help="DP: L2 bound on each site's update."),
    dp_epsilon: float = typer.Option(10.0, min=0.0, help="Local DP: epsilon per round."),
    dp_delta: float = typer.Option(1e-5, min=0.0, help="Local DP: delta per round."),
    fanout: int = typer.Option(
        4, min=1, help="Gossip: neighbours each peer offers its model to per round."
    ),
    mix: str = typer.Option(
        "pairwise", help="Gossip: pairwise (example-weighted average), clipped or trimmed (robust)."
    ),
    round_interval: float = typer.Option(
        0.1,
        min=0.0,
        help="Gossip: slotted rounds of this many seconds (peers train together, then mix); "
        "raise it above a round's training time for bigger tasks; 0: rounds back to back.",
    ),
    kill: str | None = typer.Option(
        None,
        help="Gossip fault injection: FRACTION@ROUND, e.g. 0.3@10 kills 30% of peers at round 10.",
    ),
    gpus_per_peer: float = typer.Option(
        0.0, min=0.0, help="Gossip: GPU share per peer (0.5 = two per GPU)."
    ),
    gpus_per_client: float = typer.Option(
        0.0, min=0.0, help="Federated: GPU fraction per simulated site (0.25 = four sites per GPU)."
    ),
    out: Path = typer.Option(Path("report.json"), help="Where the JSON report is written."),
    db: str | None = typer.Option(
        None,
        envvar="FEDWEAVE_DB",
        help="History database URL: sqlite:///FILE (default sqlite:///fedweave.db) or "
        "postgresql+psycopg://USER:PASS@HOST/DB.",
    ),
    checkpoint_dir: Path = typer.Option(
        Path("checkpoints"), help="Federated: where each round's global model file is kept."
    ),
    resume: str | None = typer.Option(
        None,
        help="Federated: continue run RUN_ID (or 'latest') from its last checkpoint, "
        "with its recorded config.",
    ),
    track: str | None = typer.Option(
        None,
        help="Federated: also log round metrics to mlflow or tensorboard (needs that package).",
    ),
    verbose: bool = typer.Option(False, help="Show Flower's and Ray's own logs."),
) -> None:
    """Run many sites on this machine and write a per-round report.

    Example:

        fedweave simulate --task digits --clients 10 --rounds 20 --partition dirichlet --alpha 0.5
    """
    from fedweave.simulations.report import check_writable

    _check_common(clients, rounds, alpha, partition)
    if clients_per_round is not None and not 1 <= clients_per_round <= clients:
        raise UserError(f"--clients-per-round must be between 1 and --clients ({clients})")
    check_writable(out)
    if mode is Mode.gossip:
        if resume:
            raise UserError(
                "--resume is for federated runs; a gossip peer rejoins by starting again"
            )
        from fedweave.history import DEFAULT_DB_URL
        from fedweave.simulations.gossip import GossipSimulation, run_gossip_and_report

        gossip = GossipSimulation(
            task=task,
            clients=clients,
            rounds=rounds,
            partition=partition.value,
            alpha=alpha,
            shards_per_client=shards_per_client,
            seed=seed,
            local_epochs=local_epochs,
            lr=lr,
            batch_size=batch_size,
            fanout=fanout,
            mix=mix,
            round_interval=round_interval,
            kill=kill,
            gpus_per_peer=gpus_per_peer,
            db=db or DEFAULT_DB_URL,
        )
        run_gossip_and_report(gossip, out)
        return
    from click.core import ParameterSource

    from fedweave.simulations.federated import FederatedSimulation
    from fedweave.simulations.run import Recording, run_and_report

    explicit = {
        name for name in ctx.params if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    }

    sim = FederatedSimulation(
        task=task,
        clients=clients,
        rounds=rounds,
        clients_per_round=clients_per_round,
        partition=partition.value,
        alpha=alpha,
        shards_per_client=shards_per_client,
        local_epochs=local_epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        device=device,
        gpus_per_client=gpus_per_client,
        strategy=strategy,
        secure_agg=secure_agg,
        secagg_timeout=secagg_timeout,
        max_update_norm=max_update_norm,
        dp=dp,
        noise_multiplier=noise_multiplier,
        clipping_norm=clipping_norm,
        dp_epsilon=dp_epsilon,
        dp_delta=dp_delta,
        verbose=verbose,
    )
    sim.server_settings().check()  # impossible combinations fail before anything starts
    run_and_report(sim, out, Recording(db, checkpoint_dir, resume, track), explicit)
