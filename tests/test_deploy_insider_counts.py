"""An insider's example count under SecAgg+, deployed: a registered site whose own install
rewrites its replies to claim NaN examples (after its checks and SecAgg+'s masking) failed
the run with ``cannot convert float NaN to integer``, and every ``--resume`` after it.

Three registered sites on loopback with TLS, site keys and SecAgg+ (real SuperLink, SuperNodes
and ClientApp workers). site2 trains normally and, from round 2 on, claims NaN examples
(``fault_tasks.claim_examples``). The coordinator refuses its masked-vector reply before the
sum: the site is recorded ``rejected`` with the reason, the protocol unmasks the other two as
if it had dropped out, and the run completes with a model that learned. It also calls itself
``site0`` (``--name``): it is recorded under the name its key is registered with, and the
first round says so once.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from fault_tasks import NAN_COUNT_MARK, mark_site
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

SITES = 3
ROUNDS = 3
TASK = "fault_tasks:MarkedDigits"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_site_claiming_nan_examples_under_secagg_is_rejected_and_the_run_completes(
    tmp_path, monkeypatch
):
    paths = [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))  # fault_tasks
    make_deployment(tmp_path, SITES)
    mark_site(tmp_path / "split" / "site-2.npz", NAN_COUNT_MARK)
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port = free_port()
    procs = Processes(tmp_path)
    try:
        args = coordinator_args(port, db, ROUNDS, SITES, "--once", "--evaluate-every", "0")
        args[args.index("--task") + 1] = TASK
        coordinator = procs.start("coordinator", *args)
        wait_for(
            lambda: f"site key site{SITES - 1} registered" in procs.output("coordinator"), 120,
            "the coordinator to register the site keys", coordinator,
            lambda: procs.output("coordinator"),
        )  # fmt: skip
        for i in range(SITES):
            # the insider also calls itself site0: it is recorded under its key's name
            site = site_args(port, i, None, *(["--name", "site0"] if i == SITES - 1 else []))
            site[site.index("--task") + 1] = TASK
            procs.start(f"site{i}", *site)
        out = wait_for_success(procs, coordinator, "the run to complete", timeout=600)
    finally:
        procs.close()

    rounds, site_rows, run = recorded(db)
    assert run.status == "completed" and [r["round"] for r in rounds] == [1, 2, 3], out
    by_round = {}
    for row in site_rows:
        by_round.setdefault(row["round"], {})[row["site_id"]] = (row["status"], row["reason"])
    print("sites by round:", by_round)
    assert {name: status for name, (status, _) in by_round[1].items()} == {
        "site0": "ok", "site1": "ok", "site2": "ok"
    }  # fmt: skip
    refused = "example count nan is not a whole number of at least 1"
    for later in (2, 3):
        assert by_round[later]["site2"] == ("rejected", refused), by_round[later]
        assert by_round[later]["site0"][0] == by_round[later]["site1"][0] == "ok"
        assert rounds[later - 1]["replied"] == 2
    claim = [w for w in rounds[0]["extra"]["warnings"] if "recorded under the name its key" in w]
    assert len(claim) == 1 and claim[0].startswith("site site2 (node ") and "'site0'" in claim[0]
    final = rounds[-1]["eval_accuracy"]
    assert math.isfinite(final) and final > 0.5, rounds  # chance is 0.1 on ten digits
