"""Ray nodes started by the tests with Ray's own ``ray start``, each in a process group of its
own, so a test stops exactly the nodes it started (``ray stop`` would stop every Ray process on
the machine, the session's shared cluster included).

``shared_cluster`` is the one Ray head the whole test session's federated simulations run on:
Flower's simulation engine calls ``ray.init()`` without an address, which joins the cluster
named by ``RAY_ADDRESS`` instead of starting a private Ray instance for each simulation (about
12 s of a simulation's ~39 s on a 2-core machine, and the suite runs some 50 of them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fedweave.addresses import free_ports

RAY = Path(sys.executable).with_name("ray")
CURRENT_CLUSTER = Path("/tmp/ray/ray_current_cluster")
"""Where ``ray start --head`` notes its address; ``ray.init()`` without an address joins the
cluster named there, so a stopped head's note would make every later simulation wait for it."""
START_TIMEOUT = 120
"""Seconds ``ray start`` may take on a loaded 2-core machine."""
STOP_TIMEOUT = 30
"""Seconds a stopped node's processes get to exit after SIGKILL."""


@dataclass
class RayNode:
    """A node started by ``start_node``: its process group, and the head's GCS address."""

    group: int
    address: str

    def stop(self) -> None:
        """SIGKILL every process of the node (its workers and actors included), wait until
        none is left (at most ``STOP_TIMEOUT`` seconds) and remove the head's note."""
        try:
            noted = CURRENT_CLUSTER.read_text().strip()  # Ray writes the machine's own IP
            if noted.rsplit(":", 1)[-1] == self.address.rsplit(":", 1)[-1]:
                CURRENT_CLUSTER.unlink()
        except OSError:
            pass
        try:
            os.killpg(self.group, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline:
            try:
                os.killpg(self.group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def start_node(*args: str, address: str, env: dict) -> RayNode:
    """``ray start ARGS`` in a new process group; raises with Ray's output when it fails.

    Args:
        address: the head's ``HOST:PORT`` (the head's own ``--port``, or the ``--address`` a
            worker node joins).
        env: the environment of the node's processes (its workers inherit it).
    """
    env = {key: value for key, value in env.items() if key != "RAY_ADDRESS"}
    process = subprocess.Popen(
        [str(RAY), "start", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    node = RayNode(group=process.pid, address=address)
    try:
        output, _ = process.communicate(timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired:
        node.stop()
        raise RuntimeError(f"`ray start {' '.join(args)}` took over {START_TIMEOUT} s") from None
    if process.returncode != 0:
        node.stop()
        raise RuntimeError(f"`ray start {' '.join(args)}` failed:\n{output[-3000:]}")
    return node


def start_head(env: dict, cpus: int = 1) -> RayNode:
    """A head node on 127.0.0.1 with ``cpus`` CPUs, no GPU, every port it listens on free."""
    gcs, client_server, agent = free_ports(3)
    return start_node(
        "--head", f"--port={gcs}", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}",
        "--num-gpus=0", "--include-dashboard=false", f"--ray-client-server-port={client_server}",
        f"--dashboard-agent-listen-port={agent}", "--disable-usage-stats",
        address=f"127.0.0.1:{gcs}", env=env,
    )  # fmt: skip


def shared_cluster() -> RayNode | None:
    """The session's cluster: a head with this process's share of the machine's CPUs (all
    of them, as a private instance would have; under pytest-xdist, the machine's CPUs over
    the workers, each worker having a cluster of its own), or None where Ray is not installed
    or would not start (the simulations then start their own). One simulation at a time:
    Flower gives each one an actor per CPU of the cluster, and every actor imports torch and
    the task, so two workers' simulations with an actor per core each would start twice the
    actors the cores can run."""
    if not RAY.exists():
        return None
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    try:
        return start_head(env, cpus=max(1, (os.cpu_count() or 1) // max(1, workers)))
    except RuntimeError as error:
        print(f"tests: no shared Ray cluster, each simulation starts its own: {error}",
              file=sys.stderr)
        return None
