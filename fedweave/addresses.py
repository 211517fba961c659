"""HOST:PORT parsing and free local ports, written once for every command."""

from __future__ import annotations

import socket

from fedweave.errors import UserError


def parse_host_port(text: str, flag: str, example: str = "0.0.0.0:9092") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) → (host, port), or a one-line error naming ``flag``."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UserError(f"{flag} {text!r} is not HOST:PORT (e.g. {example})")
    return host.strip("[]"), int(port_text)


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST_PORT = 20000
"""Ports handed out are drawn from here up to the OS's ephemeral range (exclusive); below it
is Ray's default range for its workers (10002-19999), which a Ray head refuses to share."""


def _ephemeral_low() -> int:
    try:
        with open(EPHEMERAL_RANGE_FILE, encoding="ascii") as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Free ports, bound together so they differ, then released. Drawn below the OS's
    ephemeral range: a port the OS hands out for ``bind(0)`` is the kind it also gives the
    next outgoing connection, which may take it before our listener does."""
    import random

    draw = random.SystemRandom()
    high = _ephemeral_low()
    socks: list[socket.socket] = []
    try:
        for _ in range(200 * count):
            if len(socks) == count:
                break
            sock = socket.socket()
            try:
                sock.bind((host, draw.randrange(LOWEST_PORT, max(high, LOWEST_PORT + 1))))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
        while len(socks) < count:  # nothing free below the ephemeral range: the OS's own
            sock = socket.socket()
            sock.bind((host, 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]
