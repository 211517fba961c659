"""``fedweave sites remove-key`` during a run: the coordinator revokes the key within a
second, Flower refuses the site's requests from then on (its in-flight reply, if any, never
arrives), later rounds go on without it, the site is told it was refused, and the
coordinator's console names the revoked key when the site tries again.

Three registered sites on loopback, TLS, plain FedAvg (``--no-secure-agg``: the figures are
about revocation, not SecAgg+'s dropout handling, which has its own tests).
"""

from __future__ import annotations

import re
import signal
import time

import pytest
from test_deploy_support import (
    Processes,
    coordinator_args,
    free_port,
    make_deployment,
    recorded,
    run_fedweave,
    site_args,
    wait_for,
)

SITES = 3
ROUNDS = 8


@pytest.mark.slow
@pytest.mark.alone  # the revocation must take under 5 s
@pytest.mark.timeout(900)
def test_removed_key_is_refused_within_seconds(tmp_path):
    make_deployment(tmp_path, SITES)  # --min-clients 2: rounds go on once site2 is revoked
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port = free_port()
    procs = Processes(tmp_path)
    try:
        for i in range(SITES):
            procs.start(f"site{i}", *site_args(port, i))
        coordinator = procs.start(
            "coordinator",
            *coordinator_args(port, db, ROUNDS, SITES - 1, "--no-secure-agg",
                              "--round-timeout", "30"),  # serves on after the run: no --once
        )  # fmt: skip
        wait_for(lambda: recorded(db)[0], 300, "round 1", coordinator,
                 lambda: procs.output("coordinator"))  # fmt: skip
        in_flight = len(recorded(db)[0]) + 1
        started = time.monotonic()
        done = run_fedweave("sites", "remove-key", "tls", "site2", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        revoked = wait_for(
            lambda: re.search(r"site key site2 revoked \(node (\d+) disconnected\)",
                              procs.output("coordinator")),
            10, "the coordinator to revoke site2", coordinator,
            lambda: procs.output("coordinator"),
        )  # fmt: skip
        seconds = time.monotonic() - started
        print(f"site2's key revoked {seconds:.2f} s after `sites remove-key` (round {in_flight})")
        assert seconds < 5
        node = revoked.group(1)
        wait_for(
            lambda: "serving: sites stay connected" in procs.output("coordinator"), 300,
            "the run to complete", coordinator, lambda: procs.output("coordinator"),
        )  # fmt: skip
        wait_for(lambda: "site2's key, revoked" in procs.output("coordinator"), 60,
                 "the coordinator to show site2 refused when it tries again", coordinator,
                 lambda: procs.output("coordinator"))  # fmt: skip
        coordinator.send_signal(signal.SIGTERM)
        coordinator.wait(30)
        out = procs.output("coordinator")
        wait_for(lambda: "refused this site" in procs.output("site2"), 60,
                 "site2 to be told it is refused", log=lambda: procs.output("site2"))  # fmt: skip
    finally:
        procs.close()
    rounds, site_rows, run = recorded(db)
    assert run.status == "completed" and len(rounds) == ROUNDS, out
    assert rounds[-1]["eval_accuracy"] > 0.5
    def is_site2(s: dict) -> bool:  # recorded by its name (its key file's) once it replied
        return s["site_id"] == "site2" or str((s["metrics"] or {}).get("node_id")) == node

    later = [s for s in site_rows if s["round"] > in_flight and is_site2(s)]
    assert all(s["status"] != "ok" for s in later), later  # never again counted
    for s in site_rows:
        if s["round"] == in_flight and is_site2(s):
            print(f"site2 in round {in_flight} (in flight at revocation): {s['status']} "
                  f"{s.get('reason') or ''}")  # fmt: skip
    print(out)
