"""An outsider who holds only the public CA certificate, on another host, against a default
``fedweave coordinator`` (TLS, registered sites only) with one registered site running.

Three network namespaces on a bridge: the coordinator, its site, the outsider. The outsider
(``fixtures/outsider.py``, written on Flower's own Control and Runtime API clients) tries
``ListNodes``, ``StartRun`` with a bundle carrying its own code, ``RegisterNode`` with its own
key and ``AcquireTask`` of the ServerApp: each is refused (HTTP 403) and the run goes on. A
caller on the coordinator's own machine passes the first lock; its foreign bundle is refused
by the second (fedweave's bundles only). The history URL is in no Flower process's
environment. Needs root (``ip netns``); elsewhere it skips and says why.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import namespace_hosts
from test_deploy_support import (
    Processes,
    descendants,
    recorded,
    run_fedweave,
    wait_for,
)

OUTSIDER = Path(__file__).parent / "fixtures" / "outsider.py"
PORT = 9092


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _outsider(host, address: str, ca: Path, marker: Path) -> dict[str, str]:
    done = subprocess.run(
        host.command([sys.executable, str(OUTSIDER), address, str(ca), str(marker)]),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_outsider_with_the_ca_certificate_is_refused_everything(tmp_path):
    with namespace_hosts(3) as (coordinator_host, site_host, outsider_host):
        for step in (
            ("certs", "init", "--out", "tls", "--host", coordinator_host.address),
            ("data", "split", "--task", "digits", "--clients", "1", "--partition", "iid",
             "--seed", "0", "--out", "split"),
            ("sites", "new-key", "--out", "site0.key"),
            ("sites", "add-key", "tls", "site0.pub"),
        ):  # fmt: skip
            done = run_fedweave(*step, cwd=tmp_path)
            assert done.returncode == 0, (step, done.stderr)
        address = f"{coordinator_host.address}:{PORT}"
        db = f"sqlite:///{tmp_path / 'history.db'}"
        marker = tmp_path / "outsider-code-ran"
        procs = Processes(tmp_path)
        try:
            coordinator = procs.start(
                "coordinator", "coordinator", "--address", address, "--task", "digits",
                "--rounds", "3", "--min-clients", "1", "--no-secure-agg", "--db", db,
                "--tls-dir", "tls", "--test-data", "split/test.npz",
                "--round-timeout", "60", host=coordinator_host,
            )  # fmt: skip
            procs.start(
                "site", "client", "--coordinator", address, "--task", "digits",
                "--data", "split/site-0.npz", "--ca-cert", "tls/ca.pem",
                "--site-key", "site0.key", "--log-file", "site.log", host=site_host,
            )  # fmt: skip
            wait_for(lambda: recorded(db)[0], 300, "round 1", coordinator,
                     lambda: procs.output("coordinator"))  # fmt: skip

            seen = _outsider(outsider_host, address, tmp_path / "tls" / "ca.pem", marker)
            print("outsider on another host:", json.dumps(seen, indent=1))
            for call in ("ListNodes", "StartRun", "RegisterNode", "AcquireTask"):
                assert seen[call].startswith("refused") and "403" in seen[call], (call, seen)

            local = _outsider(coordinator_host, address, tmp_path / "tls" / "ca.pem", marker)
            print("caller on the coordinator's machine:", json.dumps(local, indent=1))
            assert local["StartRun"].startswith("refused") and "412" in local["StartRun"], local
            link_log = (tmp_path / "coordinator-state" / "superlink.log").read_text()
            assert "StartRun refused: the bundle carries files (evil.py)" in link_log

            secret = db.encode()
            children = descendants(coordinator.pid)
            assert children, "the coordinator's Flower processes not found"
            assert not [pid for pid in children if secret in _environ(pid)]
            deployment = tmp_path / "coordinator-state" / "secrets" / "deployment.json"
            assert deployment.stat().st_mode & 0o077 == 0, oct(deployment.stat().st_mode)
            written = [tmp_path / "coordinator-state" / "superlink.log", tmp_path / "history.db",
                       *tmp_path.glob("site*.log")]  # fmt: skip
            assert len(written) > 2 and all(  # logs and history: their owner's only
                path.stat().st_mode & 0o777 == 0o600 for path in written
            ), [(path.name, oct(path.stat().st_mode)) for path in written]

            # without --once the SuperLink serves on after the run: every probe above found
            # it up, however long they took (a 3-round --once run could end before them)
            wait_for(
                lambda: "serving: sites stay connected" in procs.output("coordinator"), 300,
                "the run to complete", coordinator, lambda: procs.output("coordinator"),
            )  # fmt: skip
            coordinator.send_signal(signal.SIGTERM)
            coordinator.wait(30)
            out = procs.output("coordinator")
        finally:
            procs.close()
    assert not marker.exists(), "the outsider's code ran"
    rounds, sites, run = recorded(db)
    assert run.status == "completed" and [r["round"] for r in rounds] == [1, 2, 3], out
    assert {s["status"] for s in sites} == {"ok"}, sites  # only the registered site took part
    assert not (tmp_path / "coordinator-state" / "secrets" / "deployment.json").exists()
