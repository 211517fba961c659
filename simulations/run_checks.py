"""``fedweave simulate``'s checks of what its options name, before anything is recorded: the
sites of ``--data-dir`` counted, the report writable, GPU shares, ``--split-dir``, the Ray
cluster; then the task's data, its split, and the test data that scores the run (the
coordinator's scoring checks: ``coordinator/command/run_checks.py``).

What the options alone decide (bounds, and rules across options such as SecAgg+ against the
strategy or the schedule) is checked when the options are resolved
(``fedweave/config/commands.check_settings``, ``fedweave/config/rules.py``); the same rules
run again here once ``--data-dir``'s sites are counted.
"""

from __future__ import annotations

from typing import Any

from fedweave.config import Resolved, RunConfig
from fedweave.config.commands import check_settings
from fedweave.errors import UserError


def check_inputs(config: RunConfig, resolved: Resolved) -> RunConfig:
    """The simulation's files, GPUs and cluster checked; returns the config with
    ``--clients`` set to the sites of ``--data-dir``, when given."""
    from fedweave.simulations.gpus import check_gpu_share
    from fedweave.simulations.report import check_writable

    check_writable(config.simulation.out)
    data = config.data
    if data.data_dir is not None:
        from fedweave.simulations.site_files import site_paths

        found = len(site_paths(data.data_dir))
        if "clients" in resolved.explicit and data.clients != found:
            raise UserError(
                f"--clients {data.clients} but --data-dir {data.data_dir} holds {found} sites; "
                "leave --clients out (each file is one site)"
            )
        config = config.replace(clients=found)
        check_settings(config, "simulate")  # the rules again, with the sites counted
    simulation = config.simulation
    if simulation.mode == "gossip":
        check_gpu_share("--gpus-per-peer", simulation.gpus_per_peer, pooled=False)
        return config
    check_gpu_share("--gpus-per-client", simulation.gpus_per_client, simulation.ray_address)
    if simulation.split_dir is not None:
        try:
            simulation.split_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UserError(
                f"--split-dir {simulation.split_dir}: {error.strerror}; pick a writable "
                "directory"
            ) from None
    if simulation.ray_address:
        from fedweave.simulations.ray_cluster import check_ray_address

        check_ray_address(simulation.ray_address)
    return config


def checked_test_data(config: RunConfig, task: Any) -> Any:
    """A federated simulation's sites and split checked (``--data-dir``'s files, or the
    task's data split ``--clients`` ways), and its held-out test data, which must score the
    run as the coordinator's would (``check_scoring``)."""
    from fedweave.coordinator.command.run_checks import check_scoring, check_statistics_privacy
    from fedweave.learning.data import load_site_data
    from fedweave.simulations.site_files import check_site_files
    from fedweave.simulations.split import check_split, generates_sites

    check_statistics_privacy(config, task)
    data = config.data
    sizes: dict[str, int] = {}
    if data.data_dir is not None:
        _, test, sizes = check_site_files(task, data.data_dir, data.test_data)
    else:
        train, test = task.load_data()  # bad task or sizes fail here, before Ray
        check_split(task, data.clients, data.partition, len(train))
        if data.test_data is not None:
            test = load_site_data(data.test_data, task)
        if config.privacy.dp == "sample" and not generates_sites(task):
            from fedweave.simulations.partition import partition_indices

            parts = partition_indices(
                train.y, data.clients, data.partition, data.alpha, data.shards_per_client,
                config.training.seed,
            )  # fmt: skip
            sizes = {f"site-{index}": len(part) for index, part in enumerate(parts)}
    check_scoring(config, test)
    if config.privacy.dp in ("local", "sample"):
        check_site_delta(config.privacy.dp_delta, sizes)
    return test


def check_site_delta(delta: float, sizes: dict[str, int]) -> None:
    """Refuse a ``--dp local`` or ``sample`` delta above the smallest site's cap, 1 / (10 x its
    examples) (site name → its rows): that site would refuse every round
    (``fedweave/privacy/delta.py``; it trains on its rows less its evaluation part, so it may
    also refuse a delta just below)."""
    from fedweave.privacy.delta import default_max_delta

    if not sizes:
        return
    name = min(sizes, key=lambda site: sizes[site])
    cap = default_max_delta(sizes[name])
    if delta > cap:
        raise UserError(
            f"--dp-delta {delta:g} is above 1 / (10 x the {sizes[name]} examples of {name}), "
            f"the smallest site, which would refuse every round (a guarantee that may fail "
            f"for one example in {sizes[name]} protects none); run with --dp-delta {cap:g} "
            "or below"
        )
