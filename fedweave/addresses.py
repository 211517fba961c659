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


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports the OS just handed out (bound together so they differ, then released)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((host, 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]
