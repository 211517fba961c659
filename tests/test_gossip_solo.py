"""A run says whether it learned together: a peer waits for another before round 1, a late
joiner trains the rounds it was given, the last peers leave together, and a run mostly
alone ends ``completed-alone`` (exit 3), never ``completed``. Real peer processes on
loopback, real SQLite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from vector_peer import SCRIPT as VECTOR_PEER

from fedweave.addresses import free_ports

REPO = Path(__file__).resolve().parent.parent


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, OMP_NUM_THREADS="1", FEDWEAVE_DB="none")
    cmd = [sys.executable, str(VECTOR_PEER), "peer", "--log-level", "info", *args]
    with log.open("wb") as handle:
        return subprocess.Popen(cmd, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)


def _wait_all(procs: list[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _rounds(path: Path) -> list[int]:
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e["round"] for e in events if e["event"] == "round"]


def _peer(tmp: Path, name: str, port: int, extra: list[str]) -> list[str]:
    np.save(tmp / f"{name}.npy", np.full(4, float(port % 7)))
    return [
        "--listen", f"tcp://127.0.0.1:{port}", "--vector", str(tmp / f"{name}.npy"),
        "--insecure", "--round-interval", "0.05", "--exchange-timeout", "2",
        "--results", str(tmp / f"{name}.jsonl"), *extra,
    ]  # fmt: skip


def test_a_first_peer_waits_for_another_and_says_so_then_stops_with_the_fix(
    tmp_path: Path,
) -> None:
    (port,) = free_ports(1)
    started = time.monotonic()
    proc = _spawn(_peer(tmp_path, "a", port, ["--connect-timeout", "2"]), tmp_path / "a.log")
    assert _wait_all([proc], 60) == [2]
    log = (tmp_path / "a.log").read_text()
    print(f"stopped after {time.monotonic() - started:.1f} s")
    assert "waiting for 1 more peer(s) before round 1 (--wait-for-peers 2" in log
    assert f"error: only 1 of --wait-for-peers 2 peers live after 2s: start the others with " \
        f"--seeds tcp://127.0.0.1:{port}" in log  # fmt: skip
    assert _rounds(tmp_path / "a.jsonl") == [] and "Traceback" not in log


def test_a_peer_alone_most_of_its_run_ends_completed_alone_with_the_counts(
    tmp_path: Path,
) -> None:
    from fedweave.history import open_store

    url = f"sqlite:///{tmp_path / 'h.db'}"
    (port,) = free_ports(1)
    args = ["--wait-for-peers", "1", "--rounds", "5", "--db", url]
    proc = _spawn(_peer(tmp_path, "a", port, args), tmp_path / "a.log")
    assert _wait_all([proc], 60) == [3]  # the rounds ran, but not together
    log = (tmp_path / "a.log").read_text()
    assert "completed-alone: 5 round(s), never mixed with another peer" in log, log
    info = open_store(url).get_run("latest")
    assert info.status == "completed-alone", info
    assert info.reason == "trained alone in 5 of 5 rounds (100%, more than --max-alone 0.2)"


def test_a_late_joiner_trains_its_rounds_and_the_last_peers_leave_together(
    tmp_path: Path,
) -> None:
    """A and B start together, A with fewer rounds: it lingers (answering B) until B is done,
    so B never trains alone. C joins late with ``--rounds 6`` while the network is well
    past round 6: it trains 6 rounds from the network's round, mixing in every one."""
    ports = free_ports(3)
    seed = ["--seeds", f"tcp://127.0.0.1:{ports[0]}"]
    a = _spawn(_peer(tmp_path, "a", ports[0], ["--rounds", "60"]), tmp_path / "a.log")
    b = _spawn(_peer(tmp_path, "b", ports[1], ["--rounds", "120", *seed]), tmp_path / "b.log")
    deadline = time.monotonic() + 60
    while max(_rounds(tmp_path / "a.jsonl"), default=0) < 20 and time.monotonic() < deadline:
        time.sleep(0.1)
    c = _spawn(_peer(tmp_path, "c", ports[2], ["--rounds", "6", *seed]), tmp_path / "c.log")
    codes = _wait_all([a, b, c], 120)
    logs = {n: (tmp_path / f"{n}.log").read_text() for n in "abc"}
    assert codes == [0, 0, 0], {n: log[-1500:] for n, log in logs.items()}
    c_rounds = _rounds(tmp_path / "c.jsonl")
    print(f"c trained rounds {c_rounds[0]}..{c_rounds[-1]}; a {len(_rounds(tmp_path / 'a.jsonl'))}")
    assert len(c_rounds) == 6 and c_rounds[0] > 6  # its 6 rounds, from the network's round
    assert c_rounds == list(range(c_rounds[0], c_rounds[0] + 6))
    assert "alone in 0" in logs["c"]
    # a finished first and answered b (and c) until they were done: b was never alone
    assert "rounds done; answering the" in logs["a"]
    assert "every peer has finished or left: leaving" in logs["a"]
    assert "completed: 120 round(s), mixed with neighbours in 120, alone in 0" in logs["b"]


def test_sigterm_while_waiting_for_peers_ends_at_once(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    proc = _spawn(_peer(tmp_path, "a", port, []), tmp_path / "a.log")
    deadline = time.monotonic() + 30
    while "waiting for" not in (tmp_path / "a.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert _wait_all([proc], 20) == [128 + signal.SIGTERM]
