"""Issue 39's FedBuff rows, deployed: two registered sites whose installs are rewritten, in a
buffered asynchronous run (``--schedule async --buffer 2``, plain updates) on real processes
(TLS, site keys, a SuperLink, SuperNodes and ClientApp workers on loopback).

Five sites, as in ``bench/bench_fedbuff_insiders.py`` and the simulated replay of
``test_async_schedule.py``: ``site3`` sends NaN weights after its own update check, ``site4``
sends zero weights claiming 10**12 examples (``fault_tasks.MarkedDigits``). Before the arrivals
were checked and bounded, the model went non-finite and the run stalled (the NaN site) or sat at
chance (the zeros site). Deployed, every NaN arrival is recorded ``rejected`` with the reason,
the claim is recorded and bounded (a warning names it), no site fills two slots of a buffer,
and the model learns.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from fault_tasks import NAN_SENDING_MARK, ZEROS_CLAIMING_MARK, mark_site
from test_deploy_support import (
    Processes,
    coordinator_args,
    free_port,
    make_deployment,
    recorded,
    site_args,
    wait_for,
    wait_for_success,
)

SITES = 5
STEPS = 16
NAN_SITE, ZEROS_SITE = 3, 4
TASK = "fault_tasks:MarkedDigits"


@pytest.mark.slow
@pytest.mark.alone  # the zeros site trains nothing, so under load it is in every buffer, where
# it weighs two medians: the last rounds fell to 0.10 in a two-worker CI run (2026-12-02)
@pytest.mark.timeout(900)
def test_two_insiders_cannot_carry_a_deployed_fedbuff_run_off(tmp_path, monkeypatch):
    paths = [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))  # fault_tasks
    make_deployment(tmp_path, SITES)
    mark_site(tmp_path / "split" / f"site-{NAN_SITE}.npz", NAN_SENDING_MARK)
    mark_site(tmp_path / "split" / f"site-{ZEROS_SITE}.npz", ZEROS_CLAIMING_MARK)
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port = free_port()
    procs = Processes(tmp_path)
    try:
        args = coordinator_args(
            port, db, STEPS, SITES, "--once", "--schedule", "async", "--buffer", "2",
            "--no-secure-agg", "--evaluate-every", "0",
        )  # fmt: skip
        args[args.index("--task") + 1] = TASK
        coordinator = procs.start("coordinator", *args)
        wait_for(
            lambda: "sites connected" in procs.output("coordinator"), 60,
            "the coordinator to listen", coordinator, lambda: procs.output("coordinator"),
        )  # fmt: skip
        for i in range(SITES):
            site = site_args(port, i, None, "--name", f"site{i}")
            site[site.index("--task") + 1] = TASK
            procs.start(f"site{i}", *site)
        out = wait_for_success(procs, coordinator, "the asynchronous run to complete", 600)
    finally:
        procs.close()

    rounds, site_rows, run = recorded(db)
    assert run.status == "completed", out
    assert [r["round"] for r in rounds] == list(range(1, STEPS + 1)), out
    accuracy = [r["eval_accuracy"] for r in rounds]
    print("central accuracy by step:", [round(a, 3) for a in accuracy])
    assert all(math.isfinite(r["eval_loss"]) for r in rounds), accuracy
    # chance is 0.1 on ten digits. The zeros site still weighs a bounded share of every buffer
    # it is in and pulls the model towards zero: the last five steps averaged 0.40 in a CI run
    # of 2026-12-07 (0.83 honest). Issue 73 is to bring that within 5 points of honest.
    assert sum(accuracy[-5:]) / 5 >= 0.3, accuracy
    # recorded under the name its key is registered with, though no arrival of it was taken
    nan_rows = [s for s in site_rows if s["site_id"] == f"site{NAN_SITE}"]
    # a deployed site's worker is its own process: its rewritten install acts from its first
    # reply, so none of its arrivals is taken
    assert len(nan_rows) >= 3 and all(s["status"] == "rejected" for s in nan_rows), site_rows
    assert all("non-finite" in s["reason"] for s in nan_rows), nan_rows
    claimed = [s for s in site_rows if s["site_id"] == f"site{ZEROS_SITE}" and s["status"] == "ok"]
    assert claimed and all(s["num_examples"] == 10**12 for s in claimed), claimed
    for row in claimed:  # its step bounded the claim, and said so
        notes = rounds[row["round"] - 1]["extra"]["warnings"]
        assert any("claimed 1e+12 examples" in w and "run's median site" in w for w in notes), (
            notes
        )
    for r in rounds:  # one slot a site in every buffer
        taken = [s["site_id"] for s in site_rows
                 if s["round"] == r["round"] and s["status"] == "ok"]  # fmt: skip
        assert len(taken) == len(set(taken)) == 2, (r["round"], taken)
