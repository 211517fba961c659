"""A history database that goes away mid-run and comes back (issue 80): a deployed run on
its own PostgreSQL server, stopped (``pg_ctl stop -m fast``) after round 1 for 20 s and
started again. The coordinator says once that the database is unreachable and once that it
is back, the rounds go on and are recorded when it is, and the run completes with every
round and checkpoint recorded exactly once, without a restart."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
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

SITES = 2
ROUNDS = 4
OUTAGE_S = 20
START_POSTGRES = Path(__file__).resolve().parent.parent / "scripts" / "start-postgres.sh"


@pytest.fixture
def own_postgres():
    """A PostgreSQL server of this test's own (the suite's shared one must not stop): its URL
    and ``ctl(*args)``, ``scripts/start-postgres.sh`` on its own port and folder."""
    if os.geteuid() != 0 or not glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"):
        pytest.skip("needs root and Debian's PostgreSQL server (scripts/start-postgres.sh)")
    data = tempfile.mkdtemp(prefix="fedweave-pg-outage-", dir="/tmp")  # postgres reaches it
    env = {**os.environ, "FEDWEAVE_PG_PORT": str(free_port()), "FEDWEAVE_PG_DIR": data}

    def ctl(*args: str) -> str:
        done = subprocess.run([str(START_POSTGRES), *args], env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    try:
        yield ctl(), ctl
    finally:
        subprocess.run([str(START_POSTGRES), "stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_deployed_run_rides_out_its_database_restarting(tmp_path, own_postgres):
    db, ctl = own_postgres
    make_deployment(tmp_path, SITES)
    port = free_port()
    procs = Processes(tmp_path)
    try:
        coordinator = procs.start(
            "coordinator", *coordinator_args(port, db, ROUNDS, SITES, "--once", "--no-secure-agg",
                                             "--db-outage", "120"),
        )  # fmt: skip
        for i in range(SITES):
            procs.start(f"site{i}", *site_args(port, i))
        wait_for(lambda: recorded(db)[0], 300, "round 1", coordinator,
                 lambda: procs.output("coordinator"))  # fmt: skip
        ctl("stop")
        stopped = time.monotonic()
        wait_for(lambda: "warning: history database" in procs.output("coordinator"), 30,
                 "the coordinator to say the database is unreachable", coordinator,
                 lambda: procs.output("coordinator"))  # fmt: skip
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped)))
        assert coordinator.poll() is None, procs.output("coordinator")
        ctl()
        out = wait_for_success(procs, coordinator, "the run to complete after the outage")
    finally:
        procs.close()
    assert out.count("warning: history database") == 1, out
    assert "the run goes on, its rounds recorded once the database is back" in out
    assert out.count("the history database is back after") == 1, out
    rounds, _, run = recorded(db)
    assert run.status == "completed", out
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1)), out  # none lost or twice
    assert all(Path(r["checkpoint_path"]).is_file() for r in rounds)
    for n in range(1, ROUNDS + 1):
        assert out.count(f"round {n}/{ROUNDS}:") == 1, out
    assert rounds[-1]["eval_accuracy"] > 0.5
    print(out)
