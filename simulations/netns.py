"""Separate network hosts on one machine: Linux network namespaces on a private bridge.

Used where a run must cross a real network stack rather than loopback (the multi-host tests,
``bench/bench_gossip_exchange.py --across-veth``, ``bench/bench_gossip_vs_fedavg.py --hosts``).
The bridge lives in its own "switch" namespace, so nothing touches the machine's own network,
and every namespace made is removed on exit, also when the body fails. Needs root.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000
DEFAULT_SUBNET = "10.231.7"
"""First three octets of the hosts' addresses (a private /24 used only inside the bridge)."""


@dataclass(frozen=True)
class Host:
    """One namespace on the bridge.

    Attributes:
        namespace: the ``ip netns`` name (``ip netns exec NAME ...`` runs a command there).
        address: its IPv4 address on the bridge.
    """

    namespace: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def why_namespaces_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or ``None`` when they can."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"fwprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


@contextmanager
def bridged_hosts(count: int, subnet: str = DEFAULT_SUBNET) -> Iterator[list[Host]]:
    """``count`` namespaces with addresses ``SUBNET.1`` ... ``SUBNET.count`` on one bridge.

    Each host reaches the others through its own veth pair and the bridge, so traffic crosses
    real interfaces (and can be cut with ``link_down``). Removed on exit.
    """
    tag = uuid.uuid4().hex[:6]
    switch = f"fw{tag}sw"
    hosts = [Host(f"fw{tag}h{i}", f"{subnet}.{i + 1}") for i in range(count)]
    made: list[str] = []
    try:
        for ns in [switch, *(h.namespace for h in hosts)]:
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for i, host in enumerate(hosts):
            # made inside the host's namespace, the far end moved to the switch
            _ip("-n", host.namespace, "link", "add", "eth0", "type", "veth", "peer", "name",
                f"p{i}", "netns", switch)  # fmt: skip
            _ip("-n", switch, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.namespace, "link", "set", "eth0", "up")
        yield hosts
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


def set_link(host: Host, up: bool) -> None:
    """Cut (or restore) a host's only link: its traffic is lost, its processes keep running."""
    _ip("-n", host.namespace, "link", "set", "eth0", "up" if up else "down")


@contextmanager
def inside(host: Host) -> Iterator[None]:
    """Run the calling *thread* in ``host``'s namespace for the duration of the block.

    A network namespace is per thread on Linux: sockets this thread makes inside the block,
    and threads it starts there (ZeroMQ's I/O threads), live in ``host``'s network. Used by
    benches that keep both ends of a transfer in one process.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{host.namespace}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {host.namespace} failed")
        try:
            yield
        finally:
            libc.setns(own, CLONE_NEWNET)
    finally:
        os.close(target)
        os.close(own)
