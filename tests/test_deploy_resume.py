"""kill -9 of the coordinator mid-run, then `--resume`: its SuperLink and ServerApp die with
it, the sites keep running and reconnect, and every round is recorded exactly once."""

from __future__ import annotations

import os
import signal

import pytest
from test_deploy_support import (
    Processes,
    alive,
    coordinator_args,
    descendants,
    free_port,
    make_deployment,
    recorded,
    site_args,
    wait_for,
    wait_for_success,
)

ROUNDS = 4
SITES = 3


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_coordinator_kill_9_mid_run_then_resume(tmp_path):
    make_deployment(tmp_path, SITES)
    db_path = tmp_path / "history.db"
    db = f"sqlite:///{db_path}"
    port = free_port()
    procs = Processes(tmp_path)
    try:
        first = procs.start("coordinator", *coordinator_args(port, db, ROUNDS, SITES, "--once"))
        sites = [procs.start(f"site{i}", *site_args(port, i)) for i in range(SITES)]
        wait_for(
            lambda: len(recorded(db)[0]) >= 1,
            400,
            "round 1",
            first,
            lambda: procs.output("coordinator"),
        )

        children = descendants(first.pid)  # its SuperLink, SuperExec and ServerApp
        assert len(children) >= 2, "the coordinator's Flower processes not found"
        os.kill(first.pid, signal.SIGKILL)  # the coordinator only: its children must follow
        first.wait(10)
        wait_for(
            lambda: not alive(children),
            30,
            "the SuperLink and ServerApp to die with the coordinator",
            log=lambda: str(alive(children)),
        )
        rounds, _, run = recorded(db)
        done_before = [r["round"] for r in rounds]
        assert done_before == list(range(1, len(done_before) + 1)) and len(done_before) < ROUNDS
        assert run.status == "interrupted", run  # found dead by the next open of the history

        resumed = procs.start(
            "resumed", *coordinator_args(port, db, ROUNDS, SITES, "--once", "--resume", run.run_id)
        )
        out = wait_for_success(procs, resumed, "the resumed run to complete")
        assert f"resuming run {run.run_id} after round {len(done_before)}" in out
        assert all(site.poll() is None for site in sites), "a site died across the restart"
        for i in range(SITES):
            site = procs.output(f"site{i}")
            # the sites number the resumed rounds as the coordinator does (issue 80)
            assert f"round {ROUNDS}: trained on" in site, site[-3000:]
            assert site.count("round 1: trained on") == 1, site[-3000:]
            assert "lost; reconnecting" in procs.output(f"site{i}")
            # seen down, then listening again: rejoined at once, not after a growing wait
            assert "restarted; rejoining now" in procs.output(f"site{i}")
    finally:
        procs.close()

    rounds, site_rows, final = recorded(db)
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))  # none lost, none twice
    assert final.status == "completed" and final.rounds_completed == ROUNDS
    assert all(r["replied"] == SITES for r in rounds[len(done_before) :]), rounds
    assert rounds[-1]["eval_accuracy"] > 0.5
    for n in range(len(done_before) + 1, ROUNDS + 1):
        assert f"round {n}/{ROUNDS}: accuracy" in out
    assert f"round 1/{ROUNDS}:" not in out  # recorded rounds are not shown (or run) again
