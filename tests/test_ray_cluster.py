"""Simulated sites on a Ray cluster that is already running (``--ray-address``): a real
two-node cluster on this machine, started with Ray's own ``ray start``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_tasks import RAY_NODE_DIR_ENV
from ray_nodes import CURRENT_CLUSTER, RAY, start_head, start_node

from fedweave.addresses import free_ports
from fedweave.config import RunConfig


@pytest.fixture
def two_node_cluster(tmp_path):
    """A head node and a second node with one CPU each (one simulated site at a time each);
    every training notes its node in ``tmp_path / 'nodes'``. Yields the head's address."""
    if not RAY.exists():
        pytest.skip(f"no `ray` command beside {sys.executable}")
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    env = {
        **os.environ,
        RAY_NODE_DIR_ENV: str(nodes),  # the nodes' workers inherit it from `ray start`
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path]),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    started = []
    try:
        started.append(start_head(env))
        address = started[0].address
        (agent,) = free_ports(1)
        started.append(start_node(
            f"--address={address}", "--node-ip-address=127.0.0.1", "--num-cpus=1",
            "--num-gpus=0", f"--dashboard-agent-listen-port={agent}", "--disable-usage-stats",
            address=address, env=env,
        ))  # fmt: skip
        yield address, nodes
    finally:
        for node in reversed(started):
            node.stop()


def test_a_simulation_runs_its_sites_on_both_nodes_of_a_cluster(two_node_cluster, tmp_path):
    from fedweave.simulations.federated import run_federated_simulation

    address, nodes = two_node_cluster
    config = RunConfig.of(
        task="fault_tasks:RayNodeDigits", clients=4, rounds=2, partition="iid",
        secure_agg=False, ray_address=address, split_dir=tmp_path / "split",
    )  # fmt: skip
    started = time.monotonic()
    rows = run_federated_simulation(config)
    assert [row["replied"] for row in rows] == [4, 4]
    assert rows[-1]["accuracy"] > 0.5
    node_ids = {path.name.rsplit("-", 1)[0] for path in nodes.iterdir()}
    assert len(node_ids) == 2, (sorted(p.name for p in nodes.iterdir()), time.monotonic() - started)


def test_no_cluster_at_the_address_is_one_line_and_nothing_is_recorded(tmp_path):
    (port,) = free_ports(1)
    result = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", "simulate", "--task", "digits", "--clients", "3",
         "--rounds", "1", "--ray-address", f"127.0.0.1:{port}",
         "--db", f"sqlite:///{tmp_path / 'h.db'}", "--out", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"no Ray cluster answers at 127.0.0.1:{port}" in lines[0]
    assert "ray start --head" in lines[0]
    assert not (tmp_path / "h.db").exists() and not (tmp_path / "r.json").exists()


def test_a_dead_cluster_noted_on_this_machine_does_not_hold_up_a_simulation(
    tmp_path, monkeypatch
):
    """``ray start`` notes its cluster in /tmp/ray/ray_current_cluster, and ``ray.init()``
    without an address joins the noted cluster. One that died without ``ray stop`` used to
    leave a simulation waiting for it; the simulation now asks Ray for a private instance
    (``RAY_ADDRESS``, Ray's own way to name a cluster, is still followed)."""
    from fedweave.simulations.federated import backend_config, run_federated_simulation

    config = RunConfig.of(
        task="digits", clients=2, rounds=1, partition="iid", secure_agg=False,
        split_dir=tmp_path / "split",
    )  # fmt: skip
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6390")
    assert backend_config(config)["init_args"]["address"] == "127.0.0.1:6390"
    monkeypatch.delenv("RAY_ADDRESS")
    (dead,) = free_ports(1)  # nothing listens there
    note = CURRENT_CLUSTER.read_text() if CURRENT_CLUSTER.exists() else None
    CURRENT_CLUSTER.parent.mkdir(parents=True, exist_ok=True)
    CURRENT_CLUSTER.write_text(f"127.0.0.1:{dead}")
    try:
        started = time.monotonic()
        rows = run_federated_simulation(config)
    finally:
        if note is None:
            CURRENT_CLUSTER.unlink(missing_ok=True)
        else:
            CURRENT_CLUSTER.write_text(note)
    assert [row["replied"] for row in rows] == [2], rows
    assert time.monotonic() - started < 120
