"""Honest callers against 100 slow ones, at each web door of a coordinator (issue 72).

    python bench/bench_slow_callers.py [--slow 100] [--seconds 8]

Starts, on loopback, the operator door (``make_door``, as ``fedweave coordinator
--operator-address`` serves it), the dashboard (``/api/runs`` and ``/metrics``, as ``fedweave
dashboard`` serves them) and the bulk transfer server (``--bulk-address``, TLS), each with
fedweave's real servers. For each door and each attack (``headers``: 100 connections sending
their request line a byte a second, or nothing at all on the bulk port; ``bodies``: 100
requests whose headers are complete, no credential, and a 100 kB body sent a byte a second),
it times an honest call (an operator's ``run list`` with its token; the dashboard's run list;
a site's blob fetch with its grant) 5 times before and 5 times during the attack, and prints
the median seconds and how many of the honest calls failed. The review measured, before
issue 72: the door and the dashboard at 503 for 32-40 s under 80 slow connections, and 17 of
19 bulk fetches failed under 70.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from fedweave.bulk.server import BulkServer
from fedweave.bulk.spool import Spool
from fedweave.bulk.transfer import Link
from fedweave.certs import init_certificates
from fedweave.config import RunConfig
from fedweave.coordinator.command.operator_door import make_door
from fedweave.coordinator.command.study import resolve_study
from fedweave.dashboard.app import make_app
from fedweave.dashboard.security import Exposure
from fedweave.dashboard.server import BackgroundServer, bind
from fedweave.dashboard.views import Views
from fedweave.history import open_store
from fedweave.history.alerts import AlertRules
from fedweave.history.operators import OperatorRegistry


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _attack(port: int, count: int, bodies: bool, stop: threading.Event) -> list[socket.socket]:
    opened = []
    for _ in range(count):
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            continue
        if bodies:
            conn.sendall(b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Length: 100000\r\n\r\n")  # fmt: skip
        opened.append(conn)

    def drip() -> None:
        for _ in range(60):
            if stop.wait(1.0):
                return
            for conn in opened:
                try:
                    conn.sendall(b"x" if bodies else b"G")
                except OSError:
                    pass

    threading.Thread(target=drip, daemon=True).start()
    return opened


def _timed(call, times: int = 5) -> tuple[float, int]:
    seconds, failed = [], 0
    for _ in range(times):
        started = time.monotonic()
        try:
            call()
            seconds.append(time.monotonic() - started)
        except (OSError, urllib.error.URLError, Exception):  # noqa: BLE001 - count, go on
            failed += 1
        time.sleep(0.2)
    return (statistics.median(seconds) if seconds else float("nan")), failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fw-slow-") as tmp:
        root = Path(tmp)
        store = open_store(f"sqlite:///{root / 'history.db'}")
        token = OperatorRegistry(store).add("alice", added_by="bench")
        served = RunConfig().replace(task="digits", address="0.0.0.0:9092", insecure=True)
        door = make_door(store, lambda text, source: resolve_study(served, text, source),
                         lambda run_id, after: ([], after))  # fmt: skip
        servers, calls = [], {}
        for name, app, path, headers in (
            ("operator door", door, "/v1/runs", {"authorization": f"Bearer {token}"}),
            ("dashboard", make_app(Views(store, AlertRules())), "/api/runs", {}),
            ("dashboard /metrics", make_app(Views(store, AlertRules())), "/metrics", {}),
        ):
            exposure = Exposure("127.0.0.1", _free_port())
            servers.append(BackgroundServer(app, exposure, bind(exposure, "--address")))
            request = urllib.request.Request(f"http://127.0.0.1:{exposure.port}{path}",
                                             headers=headers)  # fmt: skip

            def call(request=request) -> None:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    answer.read()

            calls[name] = (exposure.port, call)
        tls = init_certificates(root / "tls", ["localhost"])
        spool = Spool(root / "spool")
        bulk = BulkServer(("127.0.0.1", 0), spool, (tls.server_cert, tls.server_key)).start()
        digest = spool.put_blob(b"\0" * 1_000_000)

        def fetch() -> None:
            granted = spool.grant(5, [digest], 0, 60)
            Link("127.0.0.1", bulk.port, granted, tls.ca_cert).fetch(digest, 1_000_000)

        calls["bulk port"] = (bulk.port, fetch)
        time.sleep(1.0)
        print(f"{'door':>20} {'attack':>8} {'before s':>9} {'during s':>9} {'failed':>7}")
        for name, (port, call) in calls.items():
            for bodies in (False, True):
                before, _ = _timed(call)
                stop = threading.Event()
                opened = _attack(port, args.slow, bodies, stop)
                try:
                    during, failed = _timed(call)
                finally:
                    stop.set()
                    for conn in opened:
                        conn.close()
                kind = "bodies" if bodies else "headers"
                print(f"{name:>20} {kind:>8} {before:>9.3f} {during:>9.3f} {failed:>4}/5",
                      flush=True)
                time.sleep(1.0)
        bulk.close()
        for server in servers:
            server.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
