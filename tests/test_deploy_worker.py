"""A site's ClientApp worker killed with SIGKILL in the middle of a training message: the
site's command starts a new worker, the message is answered with Flower's "ClientApp stopped
responding" error once the task's heartbeat has lapsed for 20 s (``flower_patches.task_expiry``;
stock Flower waits 60 s), so the coordinator records the site failed for that round well
before the round's deadline, and the site takes part again in the next round."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from fault_tasks import SLOW_ONCE_ENV, bad_site_index
from test_deploy_support import (
    Processes,
    free_port,
    make_deployment,
    recorded,
    run_fedweave,
    wait_for,
    wait_for_success,
)

SITES = 3
ROUNDS = 3
DEADLINE = 150.0
TASK = "fault_tasks:SlowOnceDigits"  # the bad site's round-2 training stalls 30 s


def worker_pids(data_file: str) -> list[int]:
    """Pids of ClientApp workers training on ``data_file``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if b"fedweave.client.worker" in argv and any(data_file.encode() in a for a in argv):
            found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.alone  # times the round's close after the kill against its deadline
@pytest.mark.timeout(900)
def test_a_worker_killed_mid_message_is_restarted_and_the_message_recorded_failed(
    tmp_path, monkeypatch
):
    paths = [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))  # fault_tasks
    monkeypatch.setenv(SLOW_ONCE_ENV, str(tmp_path / "stall"))
    make_deployment(tmp_path, SITES)
    done = run_fedweave(
        "data", "split", "--task", TASK, "--clients", str(SITES), "--partition", "iid",
        "--seed", "0", "--out", "split-slow", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    bad = bad_site_index(tmp_path / "split-slow")
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port = free_port()
    procs = Processes(tmp_path)
    try:
        coordinator = procs.start(
            "coordinator", "coordinator", "--address", f"127.0.0.1:{port}", "--task", TASK,
            "--rounds", str(ROUNDS), "--min-clients", str(SITES), "--db", db, "--tls-dir", "tls",
            "--test-data", "split-slow/test.npz", "--once",
            "--no-secure-agg", "--round-timeout", str(DEADLINE),
        )  # fmt: skip
        for i in range(SITES):
            procs.start(
                f"site{i}", "client", "--coordinator", f"127.0.0.1:{port}", "--task", TASK,
                "--data", f"split-slow/site-{i}.npz", "--ca-cert", "tls/ca.pem",
                "--site-key", f"site{i}.key", "--log-file", f"site{i}.log",
            )  # fmt: skip
        wait_for(
            lambda: (tmp_path / "stall.2").exists(), 400, "the bad site's round-2 stall",
            coordinator, lambda: procs.output("coordinator"),
        )  # fmt: skip
        victims = worker_pids(f"split-slow/site-{bad}.npz")
        assert len(victims) == 1, victims
        os.kill(victims[0], signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(
            lambda: [p for p in worker_pids(f"split-slow/site-{bad}.npz") if p != victims[0]],
            30, "a new worker", log=lambda: procs.output(f"site{bad}"),
        )  # fmt: skip
        wait_for(
            lambda: len(recorded(db)[0]) >= 2, DEADLINE, "round 2", coordinator,
            lambda: procs.output("coordinator"),
        )  # fmt: skip
        round_2_closed_after = time.monotonic() - killed_at
        out = wait_for_success(procs, coordinator, "the run to complete", timeout=300)
    finally:
        procs.close()

    rounds, site_rows, run = recorded(db)
    assert run.status == "completed" and [r["round"] for r in rounds] == [1, 2, 3]
    # closed by the error reply, not the deadline: 20 s of lapsed heartbeat, the SuperNode's
    # next look, the reply's trip (stock Flower's 60 s would not pass)
    assert round_2_closed_after < 45, round_2_closed_after
    failed = [s for s in site_rows if s["status"] != "ok"]
    assert [(s["round"], s["status"]) for s in failed] == [(2, "failed")], site_rows
    assert "stopped responding" in failed[0]["reason"], failed[0]
    assert rounds[1]["replied"] == SITES - 1 and rounds[2]["replied"] == SITES, rounds
    assert "ClientApp worker exited" in procs.output(f"site{bad}")
    assert "round 3/3: accuracy" in out
