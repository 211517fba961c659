"""A standing federation (issue 38), deployed across hosts: one coordinator serving operators'
studies only (``--studies-only``; TLS with a certificate for its address, site keys, SecAgg+)
and four registered sites in one network namespace, the operators in another, on a bridge
(``simulations/netns.py``; nothing on loopback). Each site holds digits; three also hold a
hospital's breast-cancer table (``--more-tasks``); site3's policy file takes digits runs of
operator alice only.

Operators made with ``fedweave operators add`` submit, list, follow and stop studies with
``fedweave run``, each a separate process as an operator would run it: a digits study on
all four sites and a breast-cancer study naming three of them run at once
(``--max-studies 2``), a third (carol's, 30 rounds) waits its turn, runs, is refused by
site3's policy every round, resumes its run after the coordinator is killed (``kill -9``)
and started again, and is stopped mid-way. An outsider holding ``ca.pem``, a site's
key and a removed operator are refused from the operators' host. Everything lands in the
history, the audit trail, both consoles and the dashboard (each site's current jobs while
study 3 runs; the runs and the queue after). Needs root (``ip netns``);
elsewhere it skips and says why.
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request

from conftest import namespace_hosts
from test_deploy_support import (
    Processes,
    fedweave_cmd,
    free_port,
    kill_tree_now,
    run_fedweave,
    wait_for,
)

from fedweave.learning.tasks.breast_cancer import write_hospital_files

SITES = 4
PORT, DOOR = 9092, 9094
REFUSAL = "this site's policy (policy.toml) takes runs of alice only, not operator carol's run"


def _prepare(tmp_path, address: str) -> None:
    """A CA and a certificate for the coordinator's address, the sites' keys, their data
    (digits shares, hospital tables), site3's policy and the studies."""
    steps = [
        ("certs", "init", "--out", "tls", "--host", address),
        ("data", "split", "--task", "digits", "--clients", str(SITES), "--partition", "iid",
         "--seed", "0", "--out", "split"),
    ]  # fmt: skip
    for i in range(SITES):
        steps += [("sites", "new-key", "--out", f"site{i}.key"),
                  ("sites", "add-key", "tls", f"site{i}.pub")]  # fmt: skip
    for step in steps:
        done = run_fedweave(*step, cwd=tmp_path)
        assert done.returncode == 0, (step, done.stderr)
    tables, _test = write_hospital_files(tmp_path / "hospitals")  # sites 0-2 hold a table too
    for i, table in enumerate(tables):
        table.rename(tmp_path / f"hospital{i}.csv")
    (tmp_path / "policy.toml").write_text('tasks = ["digits"]\noperators = ["alice"]\n')
    (tmp_path / "digits.toml").write_text(_study("digits", rounds=2, sites=SITES))
    (tmp_path / "cancer.toml").write_text(
        _study("breast-cancer", rounds=2, sites=3, named="site0,site1,site2")
    )
    (tmp_path / "long.toml").write_text(_study("digits", rounds=30, sites=3))
    (tmp_path / "bad.toml").write_text(_study("digits", rounds=0, sites=SITES))
    (tmp_path / "unknown.toml").write_text(_study("digits", 1, 3, named="site0,site1,clinic"))
    (tmp_path / "served.toml").write_text('[deployment]\naddress = "0.0.0.0:1"\n')
    (tmp_path / "stranger.token").write_text("fwop_" + "x" * 43 + "\n")


def _study(task: str, rounds: int, sites: int, named: str = "") -> str:
    data = ['test_data = "test.npz"'] if task == "digits" else []  # in --study-files
    lines = ["[data]", f'task = "{task}"', *data, "[training]", f"rounds = {rounds}",
             "local_epochs = 1", "[federation]", f"min_clients = {sites}",
             "round_timeout = 120", *([f'sites = "{named}"'] if named else [])]  # fmt: skip
    return "\n".join(lines) + "\n"


def test_a_standing_federation_runs_operators_studies_at_once_as_its_sites_allow(tmp_path):
    with namespace_hosts(2) as (served, elsewhere):
        _prepare(tmp_path, served.address)
        _deploy_and_operate(tmp_path, served, elsewhere)


def _deploy_and_operate(tmp_path, served, elsewhere) -> None:
    db = f"sqlite:///{tmp_path / 'history.db'}"
    for name, roles in (("alice", "submit,read-all,stop-own"), ("bob", "submit"),
                        ("carol", "submit,read-own,stop-own")):  # fmt: skip
        done = run_fedweave("operators", "add", name, "--db", db, "--roles", roles, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    done = run_fedweave("operators", "remove", "bob", "--db", db, cwd=tmp_path)
    assert done.returncode == 0, done.stderr

    address = f"{served.address}:{PORT}"
    procs = Processes(tmp_path)

    def run(*args: str, token: str = "alice.token") -> subprocess.CompletedProcess:
        """``fedweave run ARGS`` from the operators' host."""
        argv = fedweave_cmd("run", *args, "--coordinator", f"{served.address}:{DOOR}",
                            "--ca-cert", "tls/ca.pem", "--operator-token", token)  # fmt: skip
        return subprocess.run(elsewhere.command(argv), cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)  # fmt: skip

    def start_coordinator(name: str):
        return procs.start(
            name, "coordinator", "--address", address, "--studies-only", "--db", db,
            "--tls-dir", "tls", "--operator-address", f"0.0.0.0:{DOOR}", "--max-studies", "2",
            "--study-files", "split", host=served,
        )  # fmt: skip

    try:
        coordinator = start_coordinator("coordinator")
        for i in range(SITES):
            choice = ("--policy", "policy.toml") if i == 3 else (
                "--more-tasks", f"breast-cancer=hospital{i}.csv")  # fmt: skip
            procs.start(
                f"site{i}", "client", "--coordinator", address, "--task", "digits",
                "--data", f"split/site-{i}.npz", *choice, "--ca-cert", "tls/ca.pem",
                "--site-key", f"site{i}.key", "--log-file", f"site{i}.log", host=served,
            )  # fmt: skip

        def console() -> str:
            return procs.output(coordinator.name)

        wait_for(lambda: "serving the operators' studies only" in console(), 60,
                 "the door to open", coordinator, console)  # fmt: skip
        submitted = run("submit", "--config", "digits.toml")
        assert submitted.returncode == 0, submitted.stderr
        assert run("submit", "--config", "cancer.toml").returncode == 0
        third = run("submit", "--config", "long.toml", token="carol.token")
        assert third.returncode == 0 and "submitted as 3" in third.stdout, third.stderr
        # refused as the coordinator refuses its own command line, one line each, not queued
        for config, says in (("bad.toml", "bad.toml: [training] rounds must be at least 1"),
                             ("unknown.toml", "--sites names clinic, not registered here"),
                             ("served.toml", "[deployment] is the coordinator's")):  # fmt: skip
            refused = run("submit", "--config", config)
            assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
            assert says in refused.stderr, refused.stderr
        # an outsider with the CA certificate alone and a removed operator are refused by the
        # door, a site's key by the command before it sends anything; nothing of theirs queued
        for token, says in (("stranger.token", "does not know that operator token"),
                            ("bob.token", "does not know that operator token"),
                            ("site0.key", "site0.key holds no operator token")):  # fmt: skip
            for attempt in (("submit", "--config", "digits.toml"), ("list",)):
                outsider = run(*attempt, token=token)
                assert outsider.returncode == 2 and says in outsider.stderr, outsider.stderr
                assert outsider.stderr.count("\n") == 1

        wait_for(lambda: " started for submission 3" in console(), 300, "study 3's turn",
                 coordinator, console)  # fmt: skip
        ended_first = [n for n in (1, 2) if f"of submission {n} completed" in console()]
        assert ended_first, console()  # study 3 waited for one of the first two to end
        wait_for(lambda: "of submission 1 completed" in console()
                 and "of submission 2 completed" in console()
                 and "[submission 3] round 1/30" in console(), 240,
                 "studies 1 and 2, and a round of study 3", coordinator, console)  # fmt: skip
        assert f"[submission 3]   site site3 refused: {REFUSAL}" in console(), console()
        logs = run("logs", "2")
        assert logs.returncode == 0 and "round 2/2: " in logs.stdout, logs.stdout

        # the coordinator's machine loses it mid-study: started again, the study resumes
        kill_tree_now(coordinator)
        coordinator = start_coordinator("coordinator-again")
        wait_for(lambda: "[submission 3] round 2/30" in console(), 180,
                 "study 3 to resume", coordinator, console)  # fmt: skip
        assert "submission 3: the coordinator stopped during it; queued again" in console()
        assert "resuming its run" in console() and "round 1/30" not in console()
        dashboard = _dashboard(procs, db)
        now = {site["site"]: site["runs"] for site in dashboard("/api/runs")["sites"]}
        assert [(job["task"], job["status"]) for job in now["site3"]] == [("digits", "refused")]
        assert [job["status"] for job in now["site0"]] == ["ok"]  # its current job
        assert run("stop", "3", token="carol.token").returncode == 0
        wait_for(lambda: "of submission 3 stopped by operator carol" in console(), 60,
                 "study 3 to stop", coordinator, console)  # fmt: skip
        listed = run("list")
        assert listed.returncode == 0, listed.stderr
        states = [line.split()[1] for line in listed.stdout.splitlines()]
        assert states == ["completed", "completed", "stopped"], listed.stdout
        assert coordinator.poll() is None  # it serves on
        site3, site0 = procs.output("site3"), procs.output("site0")
        assert "refused operator carol's study (Flower run" in site3, site3[-3000:]
        assert "(task breast-cancer): trained on" in site0, site0[-3000:]
        assert "(task digits): trained on" in site0
        coordinator.send_signal(signal.SIGTERM)
        coordinator.wait(60)
        _dashboard_shows_it(dashboard, db)
    finally:
        procs.close()
    _recorded_as_it_happened(db, elsewhere.address)


def _dashboard(procs: Processes, db: str):
    """``fedweave dashboard`` on the history, on loopback here; its JSON reader."""
    port = free_port()
    dashboard = procs.start("dashboard", "dashboard", "--db", db, "--address",
                            f"127.0.0.1:{port}")  # fmt: skip

    def get(path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return json.load(reply)

    def up() -> bool:
        try:
            return bool(get("/api/runs"))
        except OSError:
            return False

    wait_for(up, 60, "the dashboard", dashboard, lambda: procs.output("dashboard"))
    return get


def _dashboard_shows_it(get, db: str) -> None:
    """The dashboard lists the three runs and the queue, and site3's refusal in study 3."""
    from fedweave.history import open_store
    from fedweave.history.submissions import Submissions

    with open_store(db) as store:
        long_run = Submissions(store).get(3).run_id
    listed = get("/api/runs")
    assert len(listed["runs"]) == 3 and all(run["study"] for run in listed["runs"])
    assert listed["sites"] == []  # no run under way: no site's job
    queue = listed["studies"]
    assert [(s["id"], s["state"], s["operator"]) for s in queue] == [
        (1, "completed", "alice"), (2, "completed", "alice"), (3, "stopped", "carol")
    ]  # fmt: skip
    site = get(f"/api/runs/{long_run}/sites/site3")
    assert site["counts"].get("refused", 0) >= 1, site
    assert site["history"][0]["reason"] == REFUSAL


def _recorded_as_it_happened(db: str, operators_address: str) -> None:
    from fedweave.history import open_store
    from fedweave.history.operators import OperatorRegistry
    from fedweave.history.submissions import Submissions

    with open_store(db) as store:
        runs = {run.run_id: run for run in store.list_runs()}
        queue = {row.id: row for row in Submissions(store).all()}
        audit = OperatorRegistry(store).audit(100)
        assert len(runs) == 3 and len(queue) == 3  # no run of the coordinator's own
        digits, cancer, long = (runs[queue[n].run_id] for n in (1, 2, 3))
        assert digits.task == "digits" and cancer.task == "breast-cancer"
        for run in (digits, cancer):
            assert run.status == "completed" and len(store.rounds(run.run_id)) == 2
        # the two ran at once; the third started only once one of them had ended
        assert digits.started_at < cancer.ended_at and cancer.started_at < digits.ended_at
        assert long.started_at >= min(digits.ended_at, cancer.ended_at)
        assert long.status == "interrupted" and long.reason == "stopped by operator carol"
        assert 2 <= len(store.rounds(long.run_id)) < 30  # one round before the crash, one after
        cancer_sites = {row["site_id"] for row in store.site_results(cancer.run_id)}
        assert cancer_sites == {"site0", "site1", "site2"}  # the sites it named
        refused = [r for r in store.site_results(long.run_id) if r["site_id"] == "site3"]
        assert refused and all(r["status"] == "refused" and r["reason"] == REFUSAL
                               for r in refused)  # fmt: skip
        others = [r for r in store.site_results(long.run_id, 1) if r["site_id"] != "site3"]
        assert sorted(r["status"] for r in others) == ["ok"] * 3
        digits_sites = {r["site_id"]: r["status"] for r in store.site_results(digits.run_id, 1)}
        assert digits_sites == {f"site{i}": "ok" for i in range(SITES)}  # alice's: site3 takes it
    done = [(row.actor, row.action, row.target) for row in audit if row.outcome == "done"]
    assert ("alice", "run-submit", "submission 1") in done
    assert ("carol", "run-submit", "submission 3") in done
    assert ("carol", "run-stop", "submission 3") in done
    refused = [row for row in audit if row.outcome == "refused"]
    assert {row.action for row in refused} >= {"run-submit", "GET /v1/runs"}
    assert any(row.actor.startswith("unknown token sha256:") for row in refused)
    assert all(row.address.startswith(f"{operators_address}:") for row in refused)
