"""Doors that callers without a credential cannot close (issue 72): the review's 80
connections trickling their headers kept every operator request at 503 for 40 s. Real
uvicorn servers on loopback, real sockets; every loop is bounded."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from fedweave.config import RunConfig
from fedweave.coordinator.command.operator_door import make_door
from fedweave.coordinator.command.study import resolve_study
from fedweave.dashboard import slow_callers
from fedweave.dashboard.security import Exposure
from fedweave.dashboard.server import BackgroundServer, bind
from fedweave.history import open_store
from fedweave.history.operators import OperatorRegistry

SLOW = 100


@pytest.fixture
def door(tmp_path, monkeypatch):
    monkeypatch.setattr(slow_callers, "HEADER_SECONDS", 2.0)
    store = open_store(f"sqlite:///{tmp_path / 'history.db'}")
    token = OperatorRegistry(store).add("alice", added_by="root@test")
    served = RunConfig().replace(task="digits", address="0.0.0.0:9092", insecure=True)
    app = make_door(store, lambda text, source, _who: resolve_study(served, text, source),
                    lambda run_id, after: ([], after))  # fmt: skip
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    exposure = Exposure("127.0.0.1", port)
    server = BackgroundServer(app, exposure, bind(exposure, "--operator-address"))
    try:
        yield port, token
    finally:
        server.close()
        store.close()


def _list(port: int, token: str) -> float:
    """Seconds an operator's ``run list`` takes (it must be answered 200)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/runs",
                                     headers={"authorization": f"Bearer {token}"})  # fmt: skip
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    return time.monotonic() - started


def _trickle(port: int, count: int, body: bool, stop: threading.Event) -> list[socket.socket]:
    """``count`` connections that send their headers (or, with ``body``, a study's body with
    no token) a byte a second; their sockets, to count the ones the door closed."""
    opened = []
    for _ in range(count):
        conn = socket.create_connection(("127.0.0.1", port), timeout=5)
        head = b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        conn.sendall(head + b"Content-Length: 100000\r\n\r\n" if body else head[:20])
        opened.append(conn)

    def drip() -> None:
        for _ in range(30):  # bounded: 30 s at most
            if stop.wait(1.0):
                return
            for conn in opened:
                try:
                    conn.sendall(b"x")
                except OSError:
                    pass

    threading.Thread(target=drip, daemon=True).start()
    return opened


def _closed(conn: socket.socket) -> bool:
    """Whether the server closed ``conn`` (whatever it answered first)."""
    conn.settimeout(0.5)
    try:
        for _ in range(4):
            if conn.recv(65536) == b"":
                return True
    except OSError:
        return True  # reset by the server
    return False


@pytest.mark.parametrize("body", [False, True], ids=["slow headers", "slow bodies"])
def test_an_operator_is_served_while_a_hundred_connections_trickle(door, body):
    port, token = door
    wait_for = time.monotonic() + 10
    while True:  # the server thread is up
        try:
            _list(port, token)
            break
        except OSError:
            assert time.monotonic() < wait_for
            time.sleep(0.1)
    stop = threading.Event()
    opened = _trickle(port, SLOW, body, stop)
    try:
        during = [_list(port, token) for _ in range(5)]
        assert max(during) < 2.0, during
        time.sleep(slow_callers.HEADER_SECONDS + 1.5)
        # slow headers: every one cut by the deadline or evicted; slow bodies: answered 401
        # from their headers alone (no token), the rest never read, the connection closed
        assert sum(_closed(conn) for conn in opened) == SLOW
        assert _list(port, token) < 2.0
    finally:
        stop.set()
        for conn in opened:
            conn.close()
