"""The dashboard's door under a password guesser (issue 39): a real dashboard served by
uvicorn on loopback with a credential file (no TLS: the door, not the cipher, is measured).

Prints:
- the seconds 200 wrong passwords took from one client, and how many got 401 (checked) or
  429 (refused unchecked: the source waits);
- a wrong password's check for a known and for an unknown name (``Credentials.allows``,
  median of 20 each);
- a logged-in user's request latency (median, p90) alone and during a flood of 8 threads
  guessing (a new name each time), from one source address, and from 250 (127.0.1.x: each of
  them gets its free failures, so the flood costs checks).

    python bench/bench_dashboard_door.py
"""

from __future__ import annotations

import base64
import http.client
import socket
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from fedweave.dashboard.app import make_app
from fedweave.dashboard.security import Credentials, Exposure, credential_line
from fedweave.dashboard.server import BackgroundServer, bind
from fedweave.dashboard.views import Views
from fedweave.history import open_store
from fedweave.history.alerts import AlertRules


def basic(name: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()


def get(url: str, authorization: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": authorization})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code


def get_from(source: str, port: int, authorization: str) -> int:
    """A GET of /api/runs sent from ``source`` (a 127.0.0.0/8 address of this machine)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30,
                                            source_address=(source, 0))  # fmt: skip
    try:
        connection.request("GET", "/api/runs", headers={"Authorization": authorization})
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        url = f"sqlite:///{work / 'h.db'}"
        open_store(url).close()  # an empty history: the door is what is measured
        (work / "auth").write_text(credential_line("ops", "correct horse") + "\n")
        credentials = Credentials.load(work / "auth")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        serving = Exposure("127.0.0.1", port, credentials=credentials)
        reader = open_store(url, read_only=True)
        sock = bind(serving, "--address")
        app = make_app(Views(reader, AlertRules()), credentials, hosts=serving.host_names)
        server = BackgroundServer(app, serving, sock)
        base = f"http://127.0.0.1:{port}/api/runs"
        good = basic("ops", "correct horse")
        try:
            for _ in range(100):
                try:
                    get(base, good)
                    break
                except urllib.error.URLError:
                    time.sleep(0.1)

            started = time.perf_counter()
            codes = [get(base, basic("ops", f"guess-{n}")) for n in range(200)]
            took = time.perf_counter() - started
            print(f"200 wrong passwords from one client: {took:.1f} s; "
                  f"{codes.count(401)} checked (401), {codes.count(429)} refused unchecked (429)")

            def check_seconds(name: str) -> float:
                times = []
                for n in range(20):
                    began = time.perf_counter()
                    credentials.allows(basic(name, f"wrong-{n}"))
                    times.append(time.perf_counter() - began)
                return statistics.median(times)

            print(f"a wrong password's check: known name {1000 * check_seconds('ops'):.1f} ms, "
                  f"unknown name {1000 * check_seconds('nobody'):.1f} ms")

            def latencies(count: int) -> list[float]:
                times = []
                for _ in range(count):
                    began = time.perf_counter()
                    assert get(base, good) == 200
                    times.append(time.perf_counter() - began)
                    time.sleep(0.05)
                return sorted(times)

            def flooded(sources: list[str]) -> tuple[list[float], list[int]]:
                stop = threading.Event()
                codes: list[int] = []

                def flood(first: int) -> None:
                    n = first
                    while not stop.is_set():
                        source = sources[n % len(sources)]
                        codes.append(get_from(source, port, basic(f"user-{n}", "guess")))
                        n += 8

                threads = [threading.Thread(target=flood, args=(i,), daemon=True)
                           for i in range(8)]  # fmt: skip
                for thread in threads:
                    thread.start()
                time.sleep(1.0)
                times = latencies(40)
                stop.set()
                for thread in threads:
                    thread.join(35)
                return times, codes

            for label, (times, codes) in (
                ("alone", (latencies(40), [])),
                ("during an 8-thread flood from one source", flooded(["127.0.0.2"])),
                ("during an 8-thread flood from 250 sources",
                 flooded([f"127.0.1.{i}" for i in range(1, 251)])),
            ):  # fmt: skip
                print(f"a logged-in request, {label}: median {1000 * statistics.median(times):.1f}"
                      f" ms, p90 {1000 * times[int(0.9 * len(times))]:.1f} ms"
                      + (f" (flood: {codes.count(401)} checked, {codes.count(429)} refused "
                         "unchecked)" if codes else ""))  # fmt: skip
        finally:
            server.close()
            reader.close()


if __name__ == "__main__":
    main()
