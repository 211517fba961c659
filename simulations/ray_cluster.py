"""Running a federated simulation's sites on a Ray cluster that is already up.

``fedweave simulate --ray-address HOST:PORT`` hands Flower's simulation engine that address
(``ray.init(address=...)``): the simulated sites become Ray actors on every node of the
cluster, one per ``CPUS_PER_CLIENT`` CPUs (and ``--gpus-per-client`` GPUs) a node offers. Before
anything is recorded, ``check_ray_address`` makes sure a cluster answers there, so a wrong
address ends in one line instead of Ray's own minute of retries and traceback.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from fedweave.addresses import parse_host_port
from fedweave.errors import UserError

CONNECT_TIMEOUT_SECONDS = 5.0
"""How long the check waits for the cluster's head to accept a connection."""
LOCAL_CLUSTER_FILE = Path("/tmp/ray/ray_current_cluster")
"""Where ``ray start --head`` leaves the address of the cluster it started on this machine."""
HINT = "start one with `ray start --head` (docs/multi-machine.md), or leave out --ray-address"


def resolve_ray_address(address: str) -> str:
    """``HOST:PORT`` for ``address``; ``auto`` reads the cluster started on this machine."""
    if address != "auto":
        return address
    if os.environ.get("RAY_ADDRESS") and os.environ["RAY_ADDRESS"] != "auto":
        return os.environ["RAY_ADDRESS"]
    try:
        return LOCAL_CLUSTER_FILE.read_text().strip()
    except OSError:
        raise UserError(
            f"--ray-address auto: no Ray cluster was started on this machine; {HINT}"
        ) from None


def check_ray_address(address: str, timeout: float = CONNECT_TIMEOUT_SECONDS) -> str:
    """The cluster's ``HOST:PORT`` if its head accepts a connection within ``timeout`` seconds;
    otherwise a ``UserError`` naming the address and the fix."""
    resolved = resolve_ray_address(address)
    host, port = parse_host_port(resolved, "--ray-address", example="10.0.0.5:6379")
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as error:
        raise UserError(
            f"no Ray cluster answers at {resolved} ({error.strerror or error}); {HINT}"
        ) from None
    return resolved
