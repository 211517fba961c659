"""Buffered asynchronous rounds (FedBuff, ``--schedule async``) on Flower's deployment engine:
a coordinator and three sites as real processes on loopback, with TLS and site keys, one site
held to 15% of a CPU by a cgroup CPU quota from the moment it has connected (a shared, slow
server). The model moves every two
arrivals in the order they come, so the fast sites are not held back: they make most steps,
the slow site's updates arrive stale and count less, and every step is a round of the history
with its members, their staleness and its bytes.

Needs root and a writable cgroup CPU controller (v1 ``cpu`` or v2 ``cpu.max``); skipped
otherwise, with the reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_deploy_support import (
    Processes,
    coordinator_args,
    descendants,
    free_port,
    make_deployment,
    recorded,
    site_args,
    wait_for,
    wait_for_success,
)

from fedweave.simulations.cpu_quota import CpuQuota

STEPS = 6
SITES = 3
SLOW = 2
QUOTA = 0.15


def cpu_quota(name: str, share: float) -> CpuQuota:
    if os.geteuid() != 0:
        pytest.skip("a CPU quota needs root (cgroups)")
    try:
        return CpuQuota(name, share)
    except OSError as exc:
        pytest.skip(f"no writable cgroup CPU controller here: {exc}")


def run_with_a_throttled_site(
    tmp_path: Path, sites: int, steps: int, *flags: str
) -> tuple[str, str, str]:
    """A deployed ``--schedule async`` run of ``steps`` with ``flags``, site ``SLOW`` held to
    ``QUOTA`` of a CPU once connected: (the coordinator's output, site 0's output, the
    history's URL)."""
    quota = cpu_quota(f"fedweave-test-{os.getpid()}", QUOTA)
    make_deployment(tmp_path, sites)
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port = free_port()
    procs = Processes(tmp_path)
    try:
        coord = procs.start(
            "coordinator",
            *coordinator_args(port, db, steps, sites, "--once", "--schedule", "async",
                              "--round-timeout", "120", *flags),
        )  # fmt: skip
        wait_for(
            lambda: "sites connected" in procs.output("coordinator"), 60,
            "the coordinator to listen", coord, lambda: procs.output("coordinator"),
        )  # fmt: skip
        for i in range(sites):
            site = procs.start(f"site{i}", *site_args(port, i, None, "--name", f"site{i}"))
            if i == SLOW:
                # held to the quota once connected: importing torch and Flower at 15% of a
                # CPU took ~45 s that the run only waited through (it starts with every site)
                wait_for(
                    lambda: "connected to" in procs.output(f"site{SLOW}"), 120,
                    "the throttled site to connect", site,
                    lambda: procs.output(f"site{SLOW}"),
                )  # fmt: skip
                quota.hold([site.pid, *descendants(site.pid)])
        out = wait_for_success(procs, coord, "the asynchronous run to complete")
        return out, procs.output("site0"), db
    finally:
        procs.close()
        quota.remove()


@pytest.mark.slow
@pytest.mark.alone  # times a site held to 15% of a CPU against the others: beside another
# worker the fast sites slowed too, and the throttled one caught up (3 arrivals to their 3)
@pytest.mark.timeout(900)
def test_a_deployed_async_run_is_not_held_back_by_a_throttled_site(tmp_path):
    out, _site0, db = run_with_a_throttled_site(
        tmp_path, SITES, STEPS, "--no-secure-agg", "--buffer", "2", "--compress", "int8"
    )
    assert "asynchronous (FedBuff): the model moves every 2 site updates" in out, out
    rounds, site_rows, run = recorded(db)
    assert run.status == "completed" and [r["round"] for r in rounds] == list(range(1, STEPS + 1))
    ok = [s for s in site_rows if s["status"] == "ok"]
    by_site: dict[str, list[dict]] = {}
    for row in ok:
        by_site.setdefault(row["site_id"], []).append(row)
    slow = f"site{SLOW}"
    slow_rows = by_site.get(slow, [])
    fast_counts = [len(rows) for name, rows in by_site.items() if name != slow]
    for r in rounds:  # every step applied two arrivals, from two different sites
        taken = [s["site_id"] for s in ok if s["round"] == r["round"]]
        assert len(taken) == len(set(taken)) == 2, (r["round"], ok)
    # the throttled site does not hold the others back: they make the steps
    assert len(fast_counts) == SITES - 1 and min(fast_counts) > len(slow_rows), (slow, by_site)
    for row in slow_rows:  # what it sent was trained on an older model, and counts less
        assert row["metrics"]["staleness"] >= 1, slow_rows
    assert all(r["bytes_in"] and r["bytes_out"] for r in rounds), rounds
    assert {s["metrics"]["uplink_bytes"] for s in ok} == {ok[0]["metrics"]["uplink_bytes"]}
    assert rounds[-1]["eval_accuracy"] > 0.5, rounds[-1]  # chance is 0.1 on ten digits


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_deployed_async_run_under_secagg_sums_each_buffer_securely(tmp_path):
    """Four sites, one throttled, under SecAgg+: each step is one buffer of three sites that
    held their updates and sent them only masked, in that buffer's SecAgg+ round."""
    sites, steps = 4, 4
    out, fast_site, db = run_with_a_throttled_site(tmp_path, sites, steps, "--buffer", "3")
    assert "SecAgg+ on" in out and "the model moves every 3 site updates" in out, out
    assert "held for a SecAgg+ buffer" in fast_site and "sent masked (SecAgg+)" in fast_site
    assert "in the clear" not in fast_site, fast_site
    rounds, site_rows, run = recorded(db)
    assert run.status == "completed" and [r["round"] for r in rounds] == list(range(1, steps + 1))
    ok = [s for s in site_rows if s["status"] == "ok"]
    for r in rounds:  # three distinct sites a buffer, each with the job it held
        members = [s for s in ok if s["round"] == r["round"]]
        assert len({s["site_id"] for s in members}) == 3, members
        assert all("held_job" in s["metrics"] and "staleness" in s["metrics"] for s in members)
    assert all(r["bytes_in"] and r["bytes_out"] for r in rounds), rounds
    assert rounds[-1]["eval_accuracy"] > 0.5, rounds[-1]
