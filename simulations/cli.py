"""`fedweave simulate` and `fedweave data split`; their options come from ``fedweave.config``
and the work is imported lazily."""

from __future__ import annotations

from pathlib import Path

import typer

from fedweave.config import Resolved, RunConfig, config_command
from fedweave.config.commands import option_for
from fedweave.errors import UserError

data_app = typer.Typer(help="Prepare per-site data files.", no_args_is_help=True)


@data_app.command("split")
def data_split(
    task: str = option_for("task"),
    clients: int = option_for("clients"),
    partition: str = option_for("partition"),
    alpha: float = option_for("alpha"),
    shards_per_client: int = option_for("shards_per_client"),
    seed: int = option_for("seed"),
    out: Path = typer.Option(..., help="Directory for site-<i>.npz and the held-out test.npz."),
) -> None:
    """Split a task's data into DIR/site-<i>.npz files plus a held-out DIR/test.npz."""
    import numpy as np

    from fedweave.config.run_config import SETTINGS, check_value
    from fedweave.learning.tasks import load_task
    from fedweave.simulations.partition import label_skew
    from fedweave.simulations.split import test_file, write_split

    given = {"clients": clients, "partition": partition, "alpha": alpha}
    for name, value in {**given, "shards_per_client": shards_per_client}.items():
        check_value(SETTINGS[name], value, SETTINGS[name].flag)
    task_obj = load_task(task)
    paths = write_split(task_obj, out, clients, partition, alpha, shards_per_client, seed)
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


def _simulate(config: RunConfig, resolved: Resolved) -> None:
    from fedweave.extras import require

    require("simulation", "fedweave simulate")  # Ray and flwr-datasets: not in a site's install
    from fedweave.simulations.report import check_writable

    data = config.data
    if config.training.rounds < 1:
        raise UserError(f"--rounds must be at least 1, got {config.training.rounds}")
    per_round = config.federation.clients_per_round
    if per_round is not None and not 1 <= per_round <= data.clients:
        raise UserError(f"--clients-per-round must be between 1 and --clients ({data.clients})")
    check_writable(config.simulation.out)
    if data.data_dir is not None:
        from fedweave.simulations.site_files import site_paths

        found = len(site_paths(data.data_dir))
        if "clients" in resolved.explicit and data.clients != found:
            raise UserError(
                f"--clients {data.clients} but --data-dir {data.data_dir} holds {found} sites; "
                "leave --clients out (each file is one site)"
            )
        config = config.replace(clients=found)
        data = config.data
        if config.simulation.mode == "gossip":
            raise UserError(
                "--data-dir is for federated simulations for now; give each peer its file "
                "with fedweave peer --data"
            )
    from fedweave.simulations.gpus import check_gpu_share

    if config.simulation.mode == "gossip":
        check_gpu_share("--gpus-per-peer", config.simulation.gpus_per_peer, pooled=False)
        if config.simulation.stragglers > 0:
            raise UserError("--stragglers is for federated simulations; leave it out with gossip")
        if config.simulation.ray_address:
            raise UserError(
                "--ray-address is for federated simulations (gossip peers run as processes "
                "here); leave it out with gossip"
            )
        if config.history.resume:
            raise UserError(
                "--resume is for federated runs; a gossip peer rejoins by starting again"
            )
        from fedweave.simulations.gossip_simulation import GossipSimulation, run_gossip_and_report

        run_gossip_and_report(GossipSimulation(config, secure=not config.connection.insecure))
        return
    from fedweave.simulations.federated import server_settings
    from fedweave.simulations.run import run_and_report

    server_settings(config).check()  # impossible combinations fail before anything starts
    check_gpu_share(
        "--gpus-per-client", config.simulation.gpus_per_client, config.simulation.ray_address
    )
    if config.simulation.split_dir is not None:
        try:
            config.simulation.split_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UserError(
                f"--split-dir {config.simulation.split_dir}: {error.strerror}; pick a writable "
                "directory"
            ) from None
    if config.simulation.ray_address:
        from fedweave.simulations.ray_cluster import check_ray_address

        check_ray_address(config.simulation.ray_address)
    run_and_report(config, resolved)


simulate = config_command(
    "simulate",
    _simulate,
    """Run many sites on this machine and write a per-round report.

    Example:

        fedweave simulate --task digits --clients 10 --rounds 20 --partition dirichlet --alpha 0.5
    """,
)
