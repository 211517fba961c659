"""Gossip across real hosts: one ``fedweave peer`` per network namespace, no loopback.

Four namespaces hang off a bridge that lives in a fifth ("switch") namespace, so the test
touches nothing on the machine's own network. Every peer listens on the wildcard address
and advertises its namespace's address, exactly as the quick start tells a deployment to.
The test needs root (``ip netns``); without it, it skips and says why. It removes every
namespace it made, whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import namespace_hosts

from fedweave.simulations.netns import Host

PEERS = 4
PORT = 7000
ROUNDS = 24
KILL_AT_ROUND = 10
EXCHANGE_TIMEOUT = 2.0


@pytest.fixture
def hosts() -> Iterator[list[Host]]:
    """``PEERS`` namespaces on one bridge; removed after."""
    with namespace_hosts(PEERS) as made:
        yield made


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _rounds(path: Path) -> list[dict]:
    return [e for e in _events(path) if e["event"] == "round"]


@pytest.mark.parametrize("security", ["plaintext", "curve"])
def test_peers_on_four_hosts_find_each_other_converge_and_survive_a_killed_host(
    hosts: list[str], tmp_path: Path, security: str
) -> None:
    from fedweave.learning.tasks import load_task
    from fedweave.processes import stop_process_group, tied_to_us
    from fedweave.simulations.split import test_file, write_split

    sites = write_split(load_task("digits"), tmp_path / "data", PEERS, "iid", seed=0)
    keys: list[Path] = []
    identities = []
    if security == "curve":
        from fedweave.gossip.keys import new_keys

        keys = [tmp_path / f"keys-{i}" for i in range(PEERS)]
        identities = [new_keys(k) for k in keys]
        for i, k in enumerate(keys):
            for j in range(PEERS):
                if j != i:
                    shutil.copyfile(keys[j] / "peer.key", k / "allowed" / f"peer{j}.key")
    env = dict(os.environ, OMP_NUM_THREADS="1", FEDWEAVE_DB="none")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, host in enumerate(hosts):
            argv = [
                sys.executable, "-m", "fedweave.gossip", "peer",
                "--listen", f"tcp://0.0.0.0:{PORT}",
                "--advertise", f"tcp://{host.address}:{PORT}",
                "--task", "digits", "--data", str(sites[i]),
                "--test-data", str(test_file(tmp_path / "data")),
                "--rounds", str(ROUNDS), "--seed", "0", "--threads", "1", "--device", "cpu",
                "--exchange-timeout", str(EXCHANGE_TIMEOUT), "--wait-for-peers", str(PEERS),
                "--connect-timeout", "60", "--linger", "600", "--log-level", "info",
                "--results", str(tmp_path / f"peer-{i}.jsonl"),
            ]  # fmt: skip
            if i > 0:
                seed = f"tcp://{hosts[0].address}:{PORT}"
                argv += ["--seeds", f"{identities[0].peer_id}@{seed}" if keys else seed]
            if keys:
                argv += ["--keys", str(keys[i])]
            else:
                argv.append("--insecure")  # plaintext is an explicit choice (CURVE by default)
            with (tmp_path / f"peer-{i}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        host.command(argv), env=env, stdout=log, stderr=log, **tied_to_us()
                    )
                )

        victim = PEERS - 1
        deadline = time.monotonic() + 240
        killed_at: float | None = None
        while time.monotonic() < deadline:
            rounds = [_rounds(tmp_path / f"peer-{i}.jsonl") for i in range(PEERS)]
            if killed_at is None and len(rounds[victim]) >= KILL_AT_ROUND:
                procs[victim].send_signal(signal.SIGKILL)  # the host's peer dies mid-run
                procs[victim].wait(timeout=20)
                killed_at = time.monotonic()
            survivors_done = all(
                any(e["event"] == "done" for e in _events(tmp_path / f"peer-{i}.jsonl"))
                for i in range(PEERS - 1)
            )
            if killed_at is not None and survivors_done:
                break
            assert all(p.poll() in (None, 0) for p in procs[:victim]), "a survivor died"
            time.sleep(0.2)
        else:
            raise AssertionError(f"the peers did not finish; logs in {tmp_path}")
    finally:
        for p in procs:
            stop_process_group(p, grace=20)

    logs = [(tmp_path / f"peer-{i}.log").read_text() for i in range(PEERS)]
    ready = [next(e for e in _events(tmp_path / f"peer-{i}.jsonl") if e["event"] == "ready")
             for i in range(PEERS)]  # fmt: skip
    # every peer advertises its host's address and learns every other peer's id and address
    assert [e["addr"] for e in ready] == [f"tcp://{h.address}:{PORT}" for h in hosts]
    for i, log in enumerate(logs[: PEERS - 1]):
        done = next(e for e in _events(tmp_path / f"peer-{i}.jsonl") if e["event"] == "done")
        known = {(peer_id, addr) for peer_id, addr, _ in done["members"]}
        others = {(ready[j]["peer"], ready[j]["addr"]) for j in range(PEERS) if j != i}
        assert others <= known, (i, done["members"])
        assert "Traceback" not in log
    if keys:
        assert {e["peer"] for e in ready} == {k.peer_id for k in identities}
    # the network converged: the survivors' final models agree with each other and reach
    # the loopback run's accuracy on digits (> 0.9 there with these settings)
    finals = [_rounds(tmp_path / f"peer-{i}.jsonl")[-1] for i in range(PEERS - 1)]
    assert all(f["round"] == ROUNDS for f in finals)
    assert all(f["accuracy"] > 0.88 for f in finals), [f["accuracy"] for f in finals]
    # a dead host costs the others at most the deadlines of the exchanges it was part of:
    # a round waits out at most fanout missed exchanges before the neighbour is dropped
    after = [r for i in range(PEERS - 1) for r in _rounds(tmp_path / f"peer-{i}.jsonl")
             if r["round"] > KILL_AT_ROUND + 1]  # fmt: skip
    assert max(r["seconds"] for r in after) <= EXCHANGE_TIMEOUT + 2.0
    assert sorted(r["seconds"] for r in after)[len(after) // 2] < 1.0  # most rounds: no cost
