"""Many federated sites on one machine: Flower's simulation engine (Ray), offline.

The data is split into real per-site files first (the same files `fedweave data split`
writes), so simulated sites read their data exactly as deployed sites do.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedweave.client.site_app import ClientSettings, make_client_app
from fedweave.config import RunConfig
from fedweave.config.commands import check_settings
from fedweave.coordinator.rounds.round_app import initial_weights, make_server_app
from fedweave.coordinator.rounds.round_settings import ServerSettings
from fedweave.history.round_summary import (
    RoundListener,
    RoundStartListener,
    RoundSummary,
    evaluated,
)
from fedweave.learning.data import load_site_data
from fedweave.learning.task_metrics import headline_metric
from fedweave.learning.tasks import load_task
from fedweave.privacy_accounting import with_planned_noise
from fedweave.simulations.site_files import (
    check_site_files,
    site_name,
    site_paths,
)
from fedweave.simulations.split import test_file, write_split


def server_settings(config: RunConfig, round_offset: int = 0, run_id: str = "") -> ServerSettings:
    """The coordinator's settings for a simulation of ``config`` after ``round_offset`` rounds
    (every simulated site is connected, so the cohort is drawn from all of them; ``run_id``:
    the history's, which names each site's file of the task's local layers)."""
    return ServerSettings(
        config=config,
        min_clients=config.data.clients,
        rounds=config.training.rounds - round_offset,
        round_offset=round_offset,
        run_id=run_id,
    )


CPUS_PER_CLIENT = 1.0
"""CPU cores Ray reserves for each simulated site."""


class _Collector:
    """The report's rows: round, the run's headline metric (``headline_metric``), loss,
    seconds, then the rest."""

    def __init__(self, headline: str) -> None:
        self.headline = headline
        self.rows: list[dict] = []

    def on_round(self, summary: RoundSummary) -> None:
        self.rows.append(
            {
                "round": summary.round,
                self.headline: evaluated(summary, self.headline),
                "loss": summary.loss,
                "seconds": summary.seconds,
                "replied": summary.replied,
                "failed": summary.sampled - summary.replied,
                **(
                    {"epsilon": summary.privacy["epsilon"]}
                    if summary.privacy is not None
                    else {}
                ),
                **(
                    {"simulated_clock": summary.simulated_clock}
                    if summary.simulated_clock is not None
                    else {}
                ),
            }
        )


def backend_config(config: RunConfig) -> dict:
    """Ray settings: per-client resources, quiet unless verbose, no dashboard; the cluster at
    ``--ray-address`` when given (``simulations/ray_cluster.py``), else the one Ray's own
    ``RAY_ADDRESS`` names, else a private instance.

    A private instance is asked for by name (``address="local"``): without an address
    ``ray.init`` joins the last cluster ``ray start`` noted on this machine, even one that has
    since died, and then waits for it instead of simulating."""
    verbose = config.output.verbose
    init_args: dict = {
        "logging_level": logging.INFO if verbose else logging.ERROR,
        "log_to_driver": verbose,
        "include_dashboard": False,
    }
    if config.simulation.ray_address:
        from fedweave.simulations.ray_cluster import resolve_ray_address

        init_args["address"] = resolve_ray_address(config.simulation.ray_address)
    else:
        init_args["address"] = os.environ.get("RAY_ADDRESS") or "local"
    return {
        "client_resources": {
            "num_cpus": CPUS_PER_CLIENT,
            "num_gpus": config.simulation.gpus_per_client,
        },
        "init_args": init_args,
    }


def quiet_flower(verbose: bool) -> None:
    flower = logging.getLogger("flwr")
    flower.setLevel(logging.INFO if verbose else logging.ERROR)


def run_federated_simulation(
    config: RunConfig,
    listeners: Sequence[RoundListener] = (),
    split_dir: Path | None = None,
    start_weights: list | None = None,
    round_offset: int = 0,
    statistics: dict | None = None,
    test_data: Any = None,
    round_starts: Sequence[RoundStartListener] = (),
    clock_start: float = 0.0,
    privacy: dict | None = None,
    ended_early: Callable[[str], None] | None = None,
    site_ledgers: Path | None = None,
    run_id: str = "",
    site_layers: Path | None = None,
) -> list[dict]:
    """Split the data, run ``rounds - round_offset`` rounds, return the report rows.

    Args:
        listeners: told about every round as it completes (progress, history).
        split_dir: where the per-site files go (default: a temporary directory).
        start_weights: global model to start from (resume); default: fresh init under seed.
        round_offset: rounds already done (resume); numbering continues after them.
        statistics: the federated statistics the run recorded (resume); default: gathered
            from the sites before round 1 when the task needs them.
        test_data: the held-out data, when the caller has read it and checked the site
            files already (``--data-dir``); default: read here.
        round_starts: told as each round's sites are asked (the history's round in flight).
        clock_start: the simulated clock a resumed run's rounds continue from
            (``--site-speeds``).
        privacy: the privacy ledger a resumed DP run recorded, which its rounds continue.
        ended_early: told why, when ``--max-epsilon`` ends the run before its last round.
        site_ledgers: where the simulated sites keep their own sample-DP ledgers
            (``--dp sample``; a recorded run's, so a resume continues them); default: the
            split directory.
        run_id: the history's run id (names each site's file of the task's local layers).
        site_layers: where simulated site ``NAME`` keeps its local layers (``NAME/<run
            id>.safetensors``, a task's ``local_layers``; a recorded run's, so a resume and
            ``fedweave predict --site NAME`` find them); default: the split directory.
    """
    from flwr.simulation import run_simulation

    from fedweave.flower_patches import tune_simulation_engine
    from fedweave.offline import make_flower_offline

    make_flower_offline()  # Ray reads its settings when it starts
    tune_simulation_engine()
    verbose = config.output.verbose
    quiet_flower(verbose)
    check_settings(config, "simulate")  # a caller in code gets the command's checks too
    config = with_planned_noise(config)  # --target-epsilon (the command did it already)
    settings = server_settings(config, round_offset, run_id)
    data = config.data
    task = load_task(data.task)
    with tempfile.TemporaryDirectory(prefix="fedweave-split-") as tmp:
        out_dir = (split_dir or config.simulation.split_dir or Path(tmp)).resolve()
        own_files: tuple[str, ...] = ()
        names = tuple(f"site-{index}" for index in range(data.clients))
        if data.data_dir is None:
            write_split(
                task, out_dir, data.clients, data.partition, data.alpha, data.shards_per_client,
                config.training.seed,
            )
            test_data = load_site_data(data.test_data or test_file(out_dir), task)
        else:
            if test_data is None:  # not read and checked by the caller
                paths, test_data, _ = check_site_files(task, data.data_dir, data.test_data)
            else:
                paths = site_paths(data.data_dir)
            own_files = tuple(str(p.resolve()) for p in paths)
            names = tuple(site_name(p) for p in paths)
        collector = _Collector(headline_metric(task, config.evaluation.select_metric))
        weights = (
            start_weights
            if start_weights is not None
            else initial_weights(config)
        )
        server_app = make_server_app(
            settings, test_data, weights, [collector, *listeners], statistics, round_starts,
            clock_start, privacy=privacy, ended_early=ended_early,
        )
        client_app = make_client_app(
            ClientSettings(
                task=data.task, split_dir=str(out_dir), site_files=own_files, site_names=names,
                device=config.training.device, torch_threads=1,
                eval_fraction=config.evaluation.eval_fraction,
                ledger_dir=str(site_ledgers or out_dir / "site-ledgers"),
                layers_dir=str(site_layers or out_dir / "site-layers"),
                base_model=(
                    str(config.training.initial_model) if config.training.initial_model else None
                ),
            )
        )
        run_simulation(
            server_app=server_app,
            client_app=client_app,
            num_supernodes=data.clients,
            backend_config=backend_config(config),
            verbose_logging=verbose,
        )
    return collector.rows
