"""A site's connection errors, verbatim, with the seconds until each is said (issue 22): a
wrong CA, a wrong port (nothing listens there; and a port that does not speak TLS), and a key
the coordinator does not know. Each runs a real `fedweave client` against a real coordinator
(or none) on loopback.

    python bench/bench_site_errors.py

Prints one block per case: the seconds until the site's first line about it, the seconds until
it exited (and its code), and that line.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def fedweave(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedweave.cli", *args]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(cwd: Path, *args: str) -> None:
    done = subprocess.run(fedweave(*args), cwd=cwd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"fedweave {' '.join(args)} failed: {done.stderr}")


def timed_site(cwd: Path, needle: str, *args: str, limit: float = 400) -> None:
    """Start `fedweave client ARGS`; print when a stderr line holding ``needle`` appears and
    when the site exits."""
    started = time.monotonic()
    proc = subprocess.Popen(fedweave("client", *args), cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    said_at, said = None, None
    lines = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line.rstrip())
        if said_at is None and needle in line:
            said_at, said = time.monotonic() - started, line.rstrip()
        if time.monotonic() - started > limit:
            proc.kill()
            break
    proc.wait()
    ended = time.monotonic() - started
    print(f"  said after {said_at:.1f} s: {said}" if said_at is not None else
          f"  never said {needle!r}; last lines: {lines[-3:]}")  # fmt: skip
    print(f"  exited after {ended:.1f} s with code {proc.returncode}; its last line: "
          f"{lines[-1] if lines else ''}")  # fmt: skip


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="fedweave-site-errors-") as tmp:
        work = Path(tmp)
        run(work, "certs", "init", "--out", "tls", "--host", "localhost")
        run(work, "certs", "init", "--out", "other-ca", "--host", "localhost")
        run(work, "data", "split", "--task", "digits", "--clients", "2", "--partition", "iid",
            "--out", "split")  # fmt: skip
        for name in ("site0", "stranger"):
            run(work, "sites", "new-key", "--out", f"{name}.key")
        run(work, "sites", "add-key", "tls", "site0.pub")
        port = free_port()
        coordinator = subprocess.Popen(
            fedweave("coordinator", "--address", f"127.0.0.1:{port}", "--rounds", "1",
                     "--min-clients", "3", "--db", f"sqlite:///{work / 'h.db'}", "--tls-dir",
                     "tls", "--state-dir", "state", "--once"),
            cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert coordinator.stderr is not None
        for line in coordinator.stderr:
            if "sites connected" in line:
                break
        else:
            raise SystemExit(f"the coordinator did not start (exit {coordinator.wait()})")
        base = ("--coordinator", f"127.0.0.1:{port}", "--task", "digits", "--data",
                "split/site-0.npz")  # fmt: skip
        try:
            print("wrong CA (the site holds another CA's certificate):")
            timed_site(work, "error:", *base, "--ca-cert", "other-ca/ca.pem", "--site-key",
                       "site0.key")  # fmt: skip
            print("unregistered key (a key the coordinator's operator never added):")
            timed_site(work, "refused this site", *base, "--ca-cert", "tls/ca.pem",
                       "--site-key", "stranger.key", "--log-file", "stranger.log")  # fmt: skip
        finally:
            coordinator.kill()
            coordinator.wait()
        empty = free_port()
        print("wrong port (nothing listens there; default --connect-timeout 300 s):")
        timed_site(work, "waiting:", "--coordinator", f"127.0.0.1:{empty}", "--task", "digits",
                   "--data", "split/site-0.npz", "--ca-cert", "tls/ca.pem", "--site-key",
                   "site0.key", limit=15)  # fmt: skip
        print("wrong port (another service there, not TLS):")
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            plain = server.getsockname()[1]

            def answer() -> None:
                for _ in range(5):
                    try:
                        conn, _ = server.accept()
                    except OSError:
                        return
                    with conn:
                        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

            threading.Thread(target=answer, daemon=True).start()
            timed_site(work, "error:", "--coordinator", f"127.0.0.1:{plain}", "--task", "digits",
                       "--data", "split/site-0.npz", "--ca-cert", "tls/ca.pem", "--site-key",
                       "site0.key")  # fmt: skip


if __name__ == "__main__":
    main()
