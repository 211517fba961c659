"""Three hospitals' CSVs on Flower's deployment engine: TLS, registered site keys and SecAgg+
on; one file with its columns in another order, one with an extra patient-id column; the
feature statistics gathered through SecAgg+ before round 1; each site's console says what it
trained and sent."""

from __future__ import annotations

import pytest
from test_deploy_support import (
    Processes,
    free_port,
    recorded,
    run_fedweave,
    wait_for,
    wait_for_success,
)

from fedweave.learning.tasks.breast_cancer import write_hospital_files

ROUNDS = 6


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hospital_csvs_deployed_with_tls_and_secagg(tmp_path):
    sites, test = write_hospital_files(tmp_path / "sites")
    for args in (("certs", "init", "--out", "tls", "--host", "localhost"),):
        assert run_fedweave(*args, cwd=tmp_path).returncode == 0
    for i in range(len(sites)):
        done = run_fedweave("sites", "new-key", "--out", f"site{i}.key", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        done = run_fedweave("sites", "add-key", "tls", f"site{i}.pub", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port = free_port()
    procs = Processes(tmp_path)
    try:
        coord = procs.start(
            "coordinator", "coordinator", "--address", f"127.0.0.1:{port}",
            "--task", "breast-cancer", "--test-data", str(test), "--rounds", str(ROUNDS),
            "--min-clients", "3", "--db", db, "--tls-dir", "tls", "--once",
        )  # fmt: skip
        wait_for(
            lambda: "sites connected" in procs.output("coordinator"), 60,
            "the coordinator to listen", coord, lambda: procs.output("coordinator"),
        )  # fmt: skip
        for i, path in enumerate(sites):
            procs.start(
                f"site{i}", "client", "--coordinator", f"127.0.0.1:{port}",
                "--task", "breast-cancer", "--data", str(path), "--ca-cert", "tls/ca.pem",
                "--site-key", f"site{i}.key", "--log-file", f"site{i}.log",
            )  # fmt: skip
        wait_for_success(procs, coord, "the run", 480)
        rounds, site_rows, run = recorded(db)
        assert run.status == "completed" and len(rounds) == ROUNDS
        assert rounds[-1]["eval_accuracy"] >= 0.95, [r["eval_accuracy"] for r in rounds]
        assert all(r["replied"] == 3 for r in rounds)
        assert "statistics" in rounds[0]["extra"]
        coordinator_out = procs.output("coordinator")
        assert "SecAgg+ on" in coordinator_out and "TLS on" in coordinator_out
        for i in range(len(sites)):
            console = procs.output(f"site{i}")
            assert "statistics (moments) of" in console and "sent masked (SecAgg+)" in console
            assert f"round {ROUNDS}: trained on" in console, console[-2000:]
        assert "ignoring column(s) the task does not use: patient_id" in procs.output("site2")
    finally:
        procs.close()
