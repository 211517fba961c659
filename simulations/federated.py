"""Many federated sites on one machine: Flower's simulation engine (Ray), offline.

The data is split into real per-site files first (the same files `fedweave data split`
writes), so simulated sites read their data exactly as deployed sites do.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedweave.offline import make_flower_offline

make_flower_offline()

from fedweave.client.site_app import ClientSettings, make_client_app  # noqa: E402
from fedweave.coordinator.privacy import DpSettings  # noqa: E402
from fedweave.coordinator.rounds import RoundListener, RoundSummary  # noqa: E402
from fedweave.coordinator.secure_agg import SecAggSettings  # noqa: E402
from fedweave.coordinator.server_app import ServerSettings, initial_weights, make_server_app  # noqa: E402
from fedweave.learning.data import load_site_data  # noqa: E402
from fedweave.learning.task import load_task  # noqa: E402
from fedweave.simulations.split import test_file, write_split  # noqa: E402


@dataclass(frozen=True)
class FederatedSimulation:
    """One federated simulation.

    Attributes:
        task: task name or ``module:attr``.
        clients: simulated sites (default 10).
        rounds: FedAvg rounds (default 20).
        clients_per_round: sites sampled per round (default all).
        partition / alpha / shards_per_client: how the data is split
            (see ``fedweave.simulations.partition``).
        local_epochs / lr / batch_size: local training per round.
        seed: split, initial model and shuffling.
        device: ``cuda``/``cpu``/None (auto) for sites and central evaluation.
        gpus_per_client: fraction of a GPU each simulated site reserves (0.25: four per GPU).
        cpus_per_client: CPU cores each simulated site reserves (default 1).
        strategy: aggregation strategy name (``fedweave.coordinator.strategies``; default
            fedavg).
        secure_agg: SecAgg+ on (default True).
        secagg_timeout: seconds each SecAgg+ stage waits for sites (default 600).
        max_update_norm: reject updates farther than this from the global model (default none).
        dp / noise_multiplier / clipping_norm / dp_epsilon / dp_delta: differential privacy
            (see ``fedweave.coordinator.privacy``; default none).
        verbose: show Flower's and Ray's own logs.
    """

    task: str = "digits"
    clients: int = 10
    rounds: int = 20
    clients_per_round: int | None = None
    partition: str = "iid"
    alpha: float = 0.5
    shards_per_client: int = 2
    local_epochs: int = 1
    lr: float = 0.1
    batch_size: int = 16
    seed: int = 0
    device: str | None = None
    gpus_per_client: float = 0.0
    cpus_per_client: float = 1.0
    strategy: str = "fedavg"
    secure_agg: bool = True
    secagg_timeout: float = 600.0
    max_update_norm: float | None = None
    dp: str = "none"
    noise_multiplier: float = 1.0
    clipping_norm: float = 1.0
    dp_epsilon: float = 10.0
    dp_delta: float = 1e-5
    verbose: bool = False

    def server_settings(self, round_offset: int = 0) -> ServerSettings:
        """The coordinator's settings for this simulation (after ``round_offset`` rounds)."""
        return ServerSettings(
            task=self.task,
            rounds=self.rounds - round_offset,
            min_clients=self.clients,
            clients_per_round=self.clients_per_round,
            local_epochs=self.local_epochs,
            lr=self.lr,
            batch_size=self.batch_size,
            seed=self.seed,
            device=self.device,
            round_offset=round_offset,
            strategy=self.strategy,
            secure_agg=self.secure_agg,
            secagg=SecAggSettings(timeout=self.secagg_timeout),
            max_update_norm=self.max_update_norm,
            dp=DpSettings(
                self.dp, self.noise_multiplier, self.clipping_norm, self.dp_epsilon, self.dp_delta
            ),
        )


class _Collector:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def on_round(self, summary: RoundSummary) -> None:
        self.rows.append(
            {
                "round": summary.round,
                "accuracy": summary.accuracy,
                "loss": summary.loss,
                "seconds": summary.seconds,
                "replied": summary.replied,
                "failed": summary.sampled - summary.replied,
            }
        )


def backend_config(sim: FederatedSimulation) -> dict:
    """Ray settings: per-client resources, quiet unless verbose, no dashboard."""
    return {
        "client_resources": {"num_cpus": sim.cpus_per_client, "num_gpus": sim.gpus_per_client},
        "init_args": {
            "logging_level": logging.INFO if sim.verbose else logging.ERROR,
            "log_to_driver": sim.verbose,
            "include_dashboard": False,
        },
    }


def quiet_flower(verbose: bool) -> None:
    logging.getLogger("flwr").setLevel(logging.INFO if verbose else logging.ERROR)


def run_federated_simulation(
    sim: FederatedSimulation,
    listeners: Sequence[RoundListener] = (),
    split_dir: Path | None = None,
    start_weights: list | None = None,
    round_offset: int = 0,
) -> list[dict]:
    """Split the data, run ``sim.rounds - round_offset`` rounds, return the report rows.

    Args:
        listeners: told about every round as it completes (progress, history).
        split_dir: where the per-site files go (default: a temporary directory).
        start_weights: global model to start from (resume); default: fresh init under seed.
        round_offset: rounds already done (resume); numbering continues after them.
    """
    from flwr.simulation import run_simulation

    from fedweave.flower_patches import tune_simulation_polling

    tune_simulation_polling()
    quiet_flower(sim.verbose)
    sim.server_settings(round_offset).check()
    task = load_task(sim.task)
    with tempfile.TemporaryDirectory(prefix="fedweave-split-") as tmp:
        out_dir = split_dir or Path(tmp)
        write_split(
            task, out_dir, sim.clients, sim.partition, sim.alpha, sim.shards_per_client, sim.seed
        )
        test_data = load_site_data(test_file(out_dir), task)
        collector = _Collector()
        server_settings = sim.server_settings(round_offset)
        weights = (
            start_weights if start_weights is not None else initial_weights(sim.task, sim.seed)
        )
        server_app = make_server_app(server_settings, test_data, weights, [collector, *listeners])
        client_app = make_client_app(
            ClientSettings(
                task=sim.task, split_dir=str(out_dir), device=sim.device, torch_threads=1
            )
        )
        run_simulation(
            server_app=server_app,
            client_app=client_app,
            num_supernodes=sim.clients,
            backend_config=backend_config(sim),
            verbose_logging=sim.verbose,
        )
    return collector.rows
