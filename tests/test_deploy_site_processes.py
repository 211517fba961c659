"""A deployed run (TLS, site keys, SecAgg+) in which one of three sites trains across two
processes (``--nproc-per-node 2``, gloo): its rounds count like any site's, its console says
how many processes trained, and a rank killed mid-round fails that site's round alone (the
others' sum stands), with the rank and the signal as the reason, no rank left behind, and
the next round trains across two processes again."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from test_deploy_support import (
    Processes,
    coordinator_args,
    free_port,
    make_deployment,
    processes_mentioning,
    recorded,
    site_args,
    start_coordinator,
    wait_for,
    wait_for_success,
)

from fedweave.learning.site_processes import RANK_MODULE

SITES = 3
ROUNDS = 2
KILLED_ROUND = 1
LOCAL_EPOCHS = "30"  # a round's training lasts long enough to kill a rank in it


def training_rank_1() -> int | None:
    """The pid of a rank 1 that has begun training (its job's steps file exists)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if RANK_MODULE.encode() in argv and argv[argv.index(RANK_MODULE.encode()) + 2] == b"1":
            job = Path(argv[argv.index(RANK_MODULE.encode()) + 1].decode())
            if (job / "rank-1.steps").exists():
                return int(entry.name)
    return None


def failed_reason(site_rows: list[dict]) -> str:
    return "; ".join(f"round {s['round']}: {s['reason']}" for s in site_rows if s["reason"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_site_trains_across_two_processes_and_a_killed_rank_fails_only_its_round(tmp_path):
    make_deployment(tmp_path, SITES)
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port = free_port()
    procs = Processes(tmp_path)
    try:
        coordinator = start_coordinator(
            procs, *coordinator_args(port, db, ROUNDS, SITES, "--once"),
            "--local-epochs", LOCAL_EPOCHS,
        )  # fmt: skip
        for i in range(SITES):
            extra = ("--nproc-per-node", "2") if i == 0 else ()
            procs.start(f"site{i}", *site_args(port, i, None, *extra))
        victim = wait_for(training_rank_1, 120, "rank 1 training", coordinator,
                          lambda: procs.output("site0"))  # fmt: skip
        worker = (Path("/proc") / str(victim) / "cmdline").read_bytes().split(b"\0")[-2]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(
            lambda: any(s["round"] == KILLED_ROUND and s["status"] == "failed"
                        for s in recorded(db)[1]) or len(recorded(db)[0]) >= KILLED_ROUND,
            120, "the killed rank's round", coordinator, lambda: procs.output("coordinator"),
        )  # fmt: skip
        to_outcome = time.monotonic() - killed_at
        out = wait_for_success(procs, coordinator, "the run to complete", timeout=300)
        site_console = procs.output("site0")
    finally:
        procs.close()

    rounds, site_rows, run = recorded(db)
    print(
        f"outcome {to_outcome:.1f} s after the kill;", failed_reason(site_rows),
        "round seconds:", [round(r["seconds"], 1) for r in rounds],
    )  # fmt: skip
    assert run.status == "completed" and [r["round"] for r in rounds] == [1, 2], out
    failed = [s for s in site_rows if s["status"] != "ok"]
    assert [(s["round"], s["status"]) for s in failed] == [(KILLED_ROUND, "failed")], site_rows
    assert failed[0]["reason"].startswith("rank 1 of 2 was killed by SIGKILL after"), failed[0]
    assert to_outcome < 30, to_outcome  # the site said so at once, long before the deadline
    assert rounds[KILLED_ROUND - 1]["replied"] == SITES - 1
    assert rounds[-1]["replied"] == SITES and rounds[-1]["eval_accuracy"] > 0.5, rounds
    across = [s["round"] for s in site_rows if s["metrics"].get("processes") == 2.0]
    assert across == [2] and all("processes" not in r["train_metrics"] for r in rounds)
    trained = [line for line in site_console.splitlines() if "trained on" in line]
    assert len(trained) == ROUNDS - 1 and all("in 2 processes" in line for line in trained)
    assert f"round {KILLED_ROUND}: rank 1 of 2 was killed by SIGKILL" in site_console
    assert not [  # the site's ranks (other tests' may run beside)
        pid for pid in processes_mentioning(RANK_MODULE)
        if (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")[-2] == worker
    ]  # fmt: skip
