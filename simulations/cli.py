"""`fedweave simulate` and `fedweave data split`; their options come from ``fedweave.config``
and the work is imported lazily."""

from __future__ import annotations

from pathlib import Path

import typer

from fedweave.config import Resolved, RunConfig, config_command
from fedweave.config.commands import option_for

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
    from fedweave.simulations.run_checks import check_inputs

    config = check_inputs(config, resolved)  # the options' rules ran as they were resolved
    if config.simulation.mode == "gossip":
        from fedweave.simulations.gossip_simulation import GossipSimulation, run_gossip_and_report

        run_gossip_and_report(GossipSimulation(config, secure=not config.connection.insecure))
        return
    from fedweave.simulations.run import run_and_report

    run_and_report(config, resolved)


simulate = config_command(
    "simulate",
    _simulate,
    """Run many sites on this machine and write a per-round report.

    Example:

        fedweave simulate --task digits --clients 10 --rounds 20 --partition dirichlet --alpha 0.5
    """,
)
