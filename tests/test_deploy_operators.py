"""A serving coordinator's operator door (issue 38), deployed across hosts: a real coordinator
(TLS with a certificate for its address, site keys, SecAgg+ off to keep it short) and two
sites in one network namespace, and the operators in another, on a bridge
(``simulations/netns.py``; nothing on loopback). Operators made with ``fedweave operators
add`` submit, list, follow and stop studies with ``fedweave run``, each a separate process
as an operator would run it; an outsider holding ``ca.pem`` and a removed operator are
refused from the same host. Studies run one after the other once the command line's run has
ended; everything lands in the history and the audit trail. Needs root (``ip netns``);
elsewhere it skips and says why.
"""

from __future__ import annotations

import signal
import subprocess

from conftest import namespace_hosts
from test_deploy_support import Processes, fedweave_cmd, run_fedweave, wait_for

SITES = 2
PORT, DOOR = 9092, 9094


def _prepare(tmp_path, address: str) -> None:
    """A CA and a certificate for the coordinator's address, the sites' keys, their data."""
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


def _study(rounds: int, epochs: int = 2) -> str:
    lines = ["[data]", 'task = "digits"', 'test_data = "split/test.npz"', "[training]",
             f"rounds = {rounds}", f"local_epochs = {epochs}", "[federation]",
             f"min_clients = {SITES}", "round_timeout = 120", "[secure_aggregation]",
             "secure_agg = false"]  # fmt: skip
    return "\n".join(lines) + "\n"


def test_operators_submit_follow_and_stop_studies_at_a_serving_coordinator(tmp_path):
    with namespace_hosts(2) as (served, elsewhere):
        _prepare(tmp_path, served.address)
        _deploy_and_operate(tmp_path, served, elsewhere)


def _deploy_and_operate(tmp_path, served, elsewhere) -> None:
    from fedweave.history import open_store
    from fedweave.history.operators import OperatorRegistry
    from fedweave.history.submissions import Submissions

    db = f"sqlite:///{tmp_path / 'history.db'}"
    for name in ("alice", "bob"):
        done = run_fedweave("operators", "add", name, "--db", db, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    done = run_fedweave("operators", "remove", "bob", "--db", db, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (tmp_path / "short.toml").write_text(_study(rounds=1))
    (tmp_path / "long.toml").write_text(_study(rounds=30))
    (tmp_path / "later.toml").write_text(_study(rounds=1))
    (tmp_path / "bad.toml").write_text(_study(rounds=0))
    (tmp_path / "served.toml").write_text('[deployment]\naddress = "0.0.0.0:1"\n')
    (tmp_path / "stranger.token").write_text("fwop_" + "x" * 43 + "\n")

    address = f"{served.address}:{PORT}"
    procs = Processes(tmp_path)

    def run(*args: str, token: str = "alice.token") -> subprocess.CompletedProcess:
        """``fedweave run ARGS`` from the operators' host."""
        argv = fedweave_cmd("run", *args, "--coordinator", f"{served.address}:{DOOR}",
                            "--ca-cert", "tls/ca.pem", "--operator-token", token)  # fmt: skip
        return subprocess.run(elsewhere.command(argv), cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)  # fmt: skip

    try:
        coordinator = procs.start(
            "coordinator", "coordinator", "--address", address, "--task", "digits",
            "--rounds", "1", "--min-clients", str(SITES), "--db", db, "--tls-dir", "tls",
            "--test-data", "split/test.npz", "--local-epochs", "2", "--round-timeout", "120",
            "--no-secure-agg", "--operator-address", f"0.0.0.0:{DOOR}", "--max-studies", "1",
            host=served,
        )  # fmt: skip
        for i in range(SITES):
            procs.start(
                f"site{i}", "client", "--coordinator", address, "--task", "digits",
                "--data", f"split/site-{i}.npz", "--ca-cert", "tls/ca.pem",
                "--site-key", f"site{i}.key", "--log-file", f"site{i}.log", host=served,
            )  # fmt: skip

        def console() -> str:
            return procs.output("coordinator")

        wait_for(lambda: "operator door at" in console(), 60, "the door to open", coordinator,
                 console)  # fmt: skip
        # studies wait for the command line's run: the first is queued behind nothing
        submitted = run("submit", "--config", "short.toml")
        assert submitted.returncode == 0, submitted.stderr
        assert "submitted as 1 (next)" in submitted.stdout
        assert run("submit", "--config", "long.toml").stdout.startswith("submitted as 2 (1 ahead")
        assert run("submit", "--config", "later.toml").returncode == 0
        # refused as the coordinator refuses its own command line, one line each, not queued
        for config, says in (("bad.toml", "bad.toml: [training] rounds must be at least 1"),
                             ("served.toml", "[deployment] is the coordinator's")):  # fmt: skip
            refused = run("submit", "--config", config)
            assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
            assert says in refused.stderr, refused.stderr
        # an outsider with the CA certificate alone and a removed operator are refused by the
        # door, a site's key by the command before it sends anything; nothing of theirs queued
        for token, says in (("stranger.token", "does not know that operator token"),
                            ("bob.token", "does not know that operator token"),
                            ("site0.key", "site0.key holds no operator token")):  # fmt: skip
            for attempt in (("submit", "--config", "short.toml"), ("list",)):
                outsider = run(*attempt, token=token)
                assert outsider.returncode == 2 and says in outsider.stderr, outsider.stderr
                assert outsider.stderr.count("\n") == 1
        stopped = run("stop", "3")
        assert stopped.returncode == 0 and "stopped before it started" in stopped.stdout

        wait_for(
            lambda: (
                "submission 2 (long.toml, by alice)" in console()
                and " started for submission 2" in console()
            ),
            300,
            "study 2 to start",
            coordinator,
            console,
        )
        logs = run("logs", "1")
        assert logs.returncode == 0 and "round 1/1: accuracy" in logs.stdout, logs.stdout
        assert "submission 1: completed" in logs.stdout
        wait_for(lambda: "round 1/30" in console(), 120, "a round of study 2", coordinator,
                 console)  # fmt: skip
        assert run("stop", "2").returncode == 0
        wait_for(lambda: "of submission 2 stopped by operator" in console(), 60, "study 2 to stop",
                 coordinator, console)  # fmt: skip
        listed = run("list")
        assert listed.returncode == 0, listed.stderr
        states = [line.split()[1] for line in listed.stdout.splitlines()]
        assert states == ["completed", "stopped", "stopped"], listed.stdout
        shown = run("show", "2")
        assert "history run" in shown.stdout and "interrupted" in shown.stdout, shown.stdout
        assert "rounds = 30" in shown.stdout
        assert coordinator.poll() is None  # it serves on
        coordinator.send_signal(signal.SIGTERM)
        coordinator.wait(60)
    finally:
        procs.close()

    with open_store(db) as store:
        runs = {run.run_id: run for run in store.list_runs()}
        queue = {row.id: row for row in Submissions(store).all()}
        audit = OperatorRegistry(store).audit(100)
        assert len(runs) == 3  # the command line's and studies 1 and 2; 3 never ran
        first, second = runs[queue[1].run_id], runs[queue[2].run_id]
        assert first.status == "completed" and len(store.rounds(first.run_id)) == 1
        assert second.status == "interrupted" and second.reason == "stopped by operator alice"
        assert 1 <= len(store.rounds(second.run_id)) < 30
        assert queue[3].run_id is None and queue[3].state == "stopped"
    done = [(row.actor, row.action, row.target) for row in audit if row.outcome == "done"]
    assert ("alice", "run-submit", "submission 1") in done
    assert ("alice", "run-stop", "submission 2") in done
    refused = [row for row in audit if row.outcome == "refused"]
    assert {row.action for row in refused} >= {"run-submit", "GET /v1/runs"}
    assert any(row.actor.startswith("unknown token sha256:") for row in refused)
    assert all(row.address.startswith(f"{elsewhere.address}:") for row in refused)
