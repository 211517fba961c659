"""A deployed run (TLS, site keys, SecAgg+) in which one of three sites trains across two
processes (``--nproc-per-node 2``, gloo): its rounds count like any site's, its console says
how many processes trained, and a rank killed mid-round (SIGKILL at its third step,
``fault_tasks.RankFaultDigits``) fails that site's round alone (the others' sum stands), with
the rank and the signal as the reason, no rank left behind, and the next round trains across
two new processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fault_tasks import RANK_FAULT_ENV
from test_deploy_support import (
    Processes,
    coordinator_args,
    free_port,
    make_deployment,
    processes_mentioning,
    recorded,
    site_args,
    start_coordinator,
    wait_for_success,
)

from fedweave.learning.site_processes import RANK_MODULE

SITES = 3
ROUNDS = 2
TASK = "fault_tasks:RankFaultDigits"  # digits; rank 1 of the first job kills itself


def ranks_in(folder: Path) -> list[int]:
    """Pids of rank processes working in ``folder`` (other tests' ranks may run beside)."""
    found = []
    for pid in processes_mentioning(RANK_MODULE):
        try:
            if os.readlink(f"/proc/{pid}/cwd") == str(folder):
                found.append(pid)
        except OSError:
            continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_site_trains_across_two_processes_and_a_killed_rank_fails_only_its_round(
    tmp_path, monkeypatch
):
    paths = [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))  # fault_tasks
    monkeypatch.setenv(RANK_FAULT_ENV, f"once:{tmp_path / 'killed'}:kill")
    make_deployment(tmp_path, SITES)
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port = free_port()
    procs = Processes(tmp_path)
    try:
        args = coordinator_args(port, db, ROUNDS, SITES, "--once")
        coordinator = start_coordinator(procs, *[TASK if a == "digits" else a for a in args])
        for i in range(SITES):
            extra = ("--nproc-per-node", "2") if i == 0 else ()
            site = [TASK if a == "digits" else a for a in site_args(port, i, None, *extra)]
            procs.start(f"site{i}", *site)
        out = wait_for_success(procs, coordinator, "the run to complete", timeout=300)
        site_console = procs.output("site0")
    finally:
        procs.close()

    rounds, site_rows, run = recorded(db)
    assert run.status == "completed" and [r["round"] for r in rounds] == [1, 2], out
    failed = [s for s in site_rows if s["status"] != "ok"]
    assert [(s["round"], s["status"]) for s in failed] == [(1, "failed")], site_rows
    assert failed[0]["reason"].startswith("rank 1 of 2 was killed by SIGKILL after"), failed[0]
    assert rounds[0]["replied"] == SITES - 1
    assert rounds[1]["replied"] == SITES and rounds[1]["eval_accuracy"] > 0.5, rounds
    across = [s["round"] for s in site_rows if s["metrics"].get("processes") == 2.0]
    assert across == [2] and all("processes" not in r["train_metrics"] for r in rounds)
    trained = [line for line in site_console.splitlines() if "trained on" in line]
    assert len(trained) == 1 and "in 2 processes" in trained[0], site_console
    assert "round 1: rank 1 of 2 was killed by SIGKILL" in site_console
    assert not ranks_in(tmp_path)
    print(failed[0]["reason"], "; round seconds:", [round(r["seconds"], 1) for r in rounds])
