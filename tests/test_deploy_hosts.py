"""The federation across real network hosts: the coordinator in one network namespace and
three sites in three others, each with its own address on a bridge (``simulations/netns.py``),
nothing on loopback. TLS is on with a certificate for the coordinator's IP address, site keys
are required, SecAgg+ is on. Faults, in order:

- round 2: one site's namespace loses its link; the round closes at its deadline and the site
  is recorded late;
- the link comes back and the site takes part again (round 3, or round 4 when Flower's
  reconnect backoff outlasts round 3's key stage);
- the coordinator is killed with ``kill -9`` and resumed; the sites rejoin and the run
  completes with every round recorded once.

Needs root (``ip netns``); elsewhere it skips and says why. Every namespace is removed after.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from conftest import namespace_hosts
from test_deploy_support import Processes, recorded, run_fedweave, wait_for, wait_for_success

from fedweave.simulations.netns import Host, set_link

SITES = 3
ROUNDS = 4
PORT = 9092
DEADLINE = 40.0


@pytest.fixture
def hosts() -> Iterator[list[Host]]:
    """The coordinator's host and one per site, on one bridge; removed after."""
    with namespace_hosts(1 + SITES) as made:
        yield made


def _prepare(tmp_path, coordinator: Host) -> None:
    """What the deployment guide has the coordinator's and the sites' operators run."""
    steps = [
        ("certs", "init", "--out", "tls", "--host", coordinator.address, "--host", "coord.lan"),
        ("data", "split", "--task", "digits", "--clients", str(SITES), "--partition", "iid",
         "--seed", "0", "--out", "split"),
    ]  # fmt: skip
    for i in range(SITES):
        steps += [("sites", "new-key", "--out", f"site{i}.key"), ("sites", "add-key", "tls",
                   f"site{i}.pub")]  # fmt: skip
    for step in steps:
        done = run_fedweave(*step, cwd=tmp_path)
        assert done.returncode == 0, (step, done.stderr)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_coordinator_and_sites_on_separate_hosts_with_link_loss_and_coordinator_kill(
    tmp_path, hosts
):
    coordinator_host, site_hosts = hosts[0], hosts[1:]
    _prepare(tmp_path, coordinator_host)
    address = f"{coordinator_host.address}:{PORT}"
    db = f"sqlite:///{tmp_path / 'history.db'}"
    coordinator_args = [
        "coordinator", "--address", address, "--task", "digits", "--rounds", str(ROUNDS),
        "--min-clients", str(SITES), "--db", db, "--tls-dir", "tls",
        "--test-data", "split/test.npz", "--once",
        "--round-timeout", str(DEADLINE),
    ]  # fmt: skip
    procs = Processes(tmp_path)
    cut = site_hosts[2]
    try:
        first = procs.start("coordinator", *coordinator_args, host=coordinator_host)
        sites = [
            procs.start(
                f"site{i}", "client", "--coordinator", address, "--task", "digits",
                "--data", f"split/site-{i}.npz", "--ca-cert", "tls/ca.pem",
                "--site-key", f"site{i}.key", "--log-file", f"site{i}.log",
                host=site_hosts[i],
            )  # fmt: skip
            for i in range(SITES)
        ]
        log = lambda: procs.output("coordinator")  # noqa: E731
        wait_for(lambda: len(recorded(db)[0]) >= 1, 400, "round 1", first, log)

        set_link(cut, up=False)
        wait_for(lambda: len(recorded(db)[0]) >= 2, DEADLINE * 3, "round 2", first, log)
        set_link(cut, up=True)
        wait_for(lambda: len(recorded(db)[0]) >= 3, 400, "round 3", first, log)

        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        run = recorded(db)[2]
        resumed = procs.start(
            "resumed", *coordinator_args, "--resume", run.run_id, host=coordinator_host
        )
        out = wait_for_success(procs, resumed, "the resumed run to complete", timeout=600)
        assert all(site.poll() is None for site in sites), "a site died"
    finally:
        set_link(cut, up=True)
        procs.close()

    rounds, site_rows, final = recorded(db)
    for r in rounds:
        print(f"round {r['round']}: {r['replied']}/{r['sampled']} replied, "
              f"{r['extra']['seconds']:.1f} s, accuracy {r['eval_accuracy']:.3f}")  # fmt: skip
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))  # none lost, none twice
    assert final.status == "completed"
    assert rounds[1]["extra"]["seconds"] <= DEADLINE * 1.1, rounds[1]
    late = [s for s in site_rows if s["status"] == "late"]
    # Round 3 starts right after round 2; the cut site may still be in Flower's reconnect
    # backoff (up to ~8 s) then, and miss round 3 too (seen in 1 run of 5). It is back by 4.
    assert [s["round"] for s in late] in ([2], [2, 3]), site_rows
    assert len({s["site_id"] for s in late}) == 1
    assert f"round deadline ({DEADLINE:g} s)" in late[0]["reason"]
    assert rounds[2]["replied"] >= SITES - 1 and rounds[3]["replied"] == SITES, rounds
    assert rounds[-1]["eval_accuracy"] > 0.5
    header = next(x for x in procs.output("coordinator").splitlines() if x.startswith("SecAgg+"))
    assert "SecAgg+ on" in header and "TLS on" in header and "authentication required" in header
    assert f"resuming run {run.run_id} after round 3" in out
    assert "rejoining" in procs.output("site0")
