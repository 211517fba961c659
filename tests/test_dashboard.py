"""The dashboard without a browser: the round in flight in the history, the stall rules, what
the views read, the web app over real SQLite and PostgreSQL histories (pages, JSON, 404,
read-only, credentials, /metrics parsed by prometheus-client's own parser), the site's status
view, and `fedweave dashboard`'s one-line refusals. The browser tests are in
``tests/test_dashboard_browser.py``."""

from __future__ import annotations

import base64
import hashlib
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from fedweave.dashboard.app import make_app
from fedweave.dashboard.security import Credentials, credential_line, exposure, is_loopback
from fedweave.dashboard.views import Views, shown_config
from fedweave.errors import UserError
from fedweave.history import RoundInFlight, RoundRecord, SiteResult, open_store
from fedweave.history.alerts import AlertRules, LateStreaks, overdue_round

REPO = Path(__file__).resolve().parents[1]
NOW = datetime.now(timezone.utc)


def _history(url: str, rounds: int = 6, late_from: int = 4) -> str:
    """A federated run: hospital-c late from round ``late_from`` on, an AUC per round, and a
    round in flight started 10 minutes ago with a 30 s deadline (overdue)."""
    store = open_store(url)
    config = {
        "command": "coordinator",
        "settings": {"training": {"rounds": rounds + 2}, "federation": {"strategy": "fedavg"},
                     "history": {"checkpoint_dir": "/srv/secret/checkpoints"},
                     "data": {"test_data": "/srv/data/test.csv"},
                     "evaluation": {"select_metric": "auc", "select_mode": "max"}},
        "protections": {"secure_aggregation": {"on": True, "shares": 3, "threshold": 2},
                        "tls": True, "site_authentication": True,
                        "differential_privacy": {"mode": "none"}},
    }  # fmt: skip
    run_id = store.start_run("federated", "breast-cancer", config, 0)
    start = NOW - timedelta(hours=1)
    for number in range(1, rounds + 1):
        began = start + timedelta(seconds=10 * number)
        late = number >= late_from
        sites = [SiteResult(f"hospital-{c}", "ok", 100, {"train_loss": 1 / number}, 2.0)
                 for c in "ab"]  # fmt: skip
        sites.append(
            SiteResult("hospital-c", "late", reason="no reply within the round deadline (30 s)")
            if late else SiteResult("hospital-c", "ok", 90, {"train_loss": 1 / number}, 2.0)
        )  # fmt: skip
        evaluation = {"central": {}, "federated": {"loss": 1 / number, "auc": 1 - 0.5 / number},
                      "sites": [{"site": "hospital-a", "status": "ok", "examples": 20,
                                 "metrics": {"loss": 1 / number, "auc": 1 - 0.5 / number}},
                                {"site": "hospital-b", "status": "failed", "examples": 0,
                                 "metrics": {}, "reason": "ValueError: column age missing"}]}
        store.record_round(run_id, RoundRecord(
            number, "coordinator", began, began + timedelta(seconds=5), 3, 3 - late, late,
            {"train_loss": 1 / number}, 1 / number, None,
            extra={"seconds": 5.0, "deadline_seconds": 30.0, "evaluation": evaluation,
                   "privacy": {"epsilon": 0.5 * number, "delta": 1e-5}},
        ), sites)  # fmt: skip
    store.note_round_started(run_id, RoundInFlight(rounds + 1, NOW - timedelta(minutes=10),
                                                   30.0, 3, 2))  # fmt: skip
    store.close()
    return run_id


def test_the_round_in_flight_is_noted_and_cleared(db_url: str) -> None:
    run_id = _history(db_url)
    with open_store(db_url) as store:
        flight = store.get_run(run_id).round_in_flight
        assert flight is not None and (flight.round, flight.deadline_seconds) == (7, 30.0)
        assert (flight.sampled, flight.connected) == (3, 2)
        assert abs((flight.started_at - (NOW - timedelta(minutes=10))).total_seconds()) < 1
        store.record_round(run_id, RoundRecord(7, "coordinator", NOW, NOW), [])
        assert store.get_run(run_id).round_in_flight is None  # recorded: nothing in flight
        store.note_round_started(run_id, RoundInFlight(8, NOW, None, 3, 3))
        assert store.get_run(run_id).round_in_flight.deadline_seconds is None
        store.finish_run(run_id, "completed")
        assert store.get_run(run_id).round_in_flight is None
        assert [r["round"] for r in store.rounds(run_id, after=5)] == [6, 7]
        assert {s["round"] for s in store.site_results(run_id, after=6)} == set()


def test_stall_rules() -> None:
    streaks = LateStreaks()
    rows = [(1, "a", "ok"), (1, "b", "late"), (2, "b", "late"), (3, "a", "late"),
            (3, "b", "late"), (4, "a", "ok")]  # fmt: skip
    streaks.add_rows([{"round": r, "site_id": s, "status": st, "reason": "why"}
                      for r, s, st in rows])  # fmt: skip
    flagged = streaks.flagged(AlertRules(late_in_a_row=3))
    assert [(s.site, s.rounds) for s in flagged] == [("b", (1, 2, 3))]
    assert flagged[0].line() == "site b late 3 rounds in a row (rounds 1-3): why; is it up?"
    assert streaks.streak("a") == []  # its round 4 was ok
    assert streaks.flagged(AlertRules(late_in_a_row=0)) == []  # 0: never

    from fedweave.history.records import RunInfo

    def run(started: datetime, deadline: float | None, status: str = "running") -> RunInfo:
        return RunInfo("r", "federated", "t", status, {}, 0, "v", NOW, None, None, 3,
                       round_in_flight=RoundInFlight(4, started, deadline, 3, 3))  # fmt: skip

    rules = AlertRules(grace_seconds=60)
    assert overdue_round(run(NOW - timedelta(seconds=119), 30.0), NOW, rules) is None
    late = overdue_round(run(NOW - timedelta(seconds=130), 30.0), NOW, rules)
    assert late is not None and round(late.overdue_seconds) == 10 and late.round == 4
    assert overdue_round(run(NOW - timedelta(hours=1), None), NOW, rules) is None
    assert overdue_round(run(NOW - timedelta(hours=1), 30.0, "completed"), NOW, rules) is None


def test_shown_config_hides_paths_urls_and_keys() -> None:
    shown = shown_config({
        "history": {"db": "postgresql://u:pw@h/db", "checkpoint_dir": "/srv/ckpt", "track": "x"},
        "connection": {"tls_dir": "tls", "ca_cert": "ca.pem", "site_key": "k"},
        "data": {"task": "digits", "test_data": "t.csv", "label_column": "y"},
        "training": {"lr": 0.1, "note": "see /etc/passwd"},
        "deployment": {"address": "0.0.0.0:9092"},
    })  # fmt: skip
    text = repr(shown)
    for secret in ("pw@", "/srv", "tls", "ca.pem", "t.csv", "/etc", "0.0.0.0"):
        assert secret not in text, (secret, shown)
    assert shown["training"] == {"lr": 0.1} and shown["data"]["task"] == "digits"


def test_views_read_incrementally_and_fold_sites(db_url: str) -> None:
    run_id = _history(db_url)
    store = open_store(db_url, read_only=True)
    views = Views(store, AlertRules(late_in_a_row=3, grace_seconds=60))
    page = views.run(run_id)
    assert [r["round"] for r in page["rounds"]] == [1, 2, 3, 4, 5, 6]
    assert page["rounds"][4]["outcomes"]["late"] == 1 and page["rounds"][0]["outcomes"]["ok"] == 3
    assert {"federated.auc", "federated.loss", "train.loss", "loss"} <= set(page["metric_names"])
    best = {"round": 6, "metric": "federated.auc", "value": pytest.approx(1 - 0.5 / 6)}
    assert page["best"] == best
    sites = {s["site"]: s for s in page["sites"]}
    assert sites["hospital-c"]["rounds"] == 3 and sites["hospital-c"]["counts"]["late"] == 3
    assert sites["hospital-b"]["problems"][-1]["reason"] == "ValueError: column age missing"
    assert sites["hospital-a"]["last_metrics"]["evaluation.auc"] == pytest.approx(1 - 0.5 / 6)
    assert [s["site"] for s in page["alerts"]["late_sites"]] == ["hospital-c"]
    assert page["alerts"]["overdue"]["round"] == 7
    assert page["in_flight"]["round"] == 7
    assert "/srv" not in repr(page)
    assert views.run(run_id, after=6)["rounds"] == []
    with open_store(db_url) as writer:  # a new round arrives: the next poll reads only it
        writer.record_round(run_id, RoundRecord(7, "coordinator", NOW, NOW, 3, 3, 0), [
            SiteResult(f"hospital-{c}", "ok", 10) for c in "abc"])  # fmt: skip
    later = views.run(run_id, after=6)
    assert [r["round"] for r in later["rounds"]] == [7]
    assert later["alerts"]["late_sites"] == [] and later["in_flight"] is None
    with pytest.raises(KeyError):
        views.run("nope")
    store.close()


def test_the_web_app_serves_pages_json_and_metrics_read_only(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    run_id = _history(url)
    store = open_store(url, read_only=True)
    client = TestClient(make_app(Views(store, AlertRules())))
    home = client.get("/")
    assert home.status_code == 200 and 'data-page="runs"' in home.text
    assert "default-src 'self'" in home.headers["content-security-policy"]
    assert "https://" not in home.text and "http://" not in home.text  # nothing from elsewhere
    import flwr

    import fedweave

    footer = f'<footer class="muted">fedweave {fedweave.__version__}, flwr {flwr.__version__}<'
    assert footer in home.text  # every page names the versions serving (issue 79)
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200 and "/srv" not in page.text and "sqlite" not in page.text
    # without JavaScript a page says so, and where its JSON is
    assert "<noscript><p>This page draws its tables and charts with JavaScript" in page.text
    assert f"The same data is JSON at <code>/api/runs/{run_id}</code>" in page.text
    assert client.get(f"/api/runs/{run_id}?after=5").json()["rounds"][0]["round"] == 6
    site = client.get(f"/api/runs/{run_id}/sites/hospital-c").json()
    assert site["late_streak"] == [4, 5, 6] and len(site["history"]) == 6
    missing = client.get("/runs/abcdef123456")
    assert missing.status_code == 404 and "no run &#x27;abcdef123456&#x27;" not in missing.text
    assert "no run 'abcdef123456' in this history" in missing.text.replace("\\u0027", "'")
    assert client.get("/api/runs/abcdef123456").status_code == 404
    assert client.get(f"/runs/{run_id}/sites/nobody").status_code == 404
    assert client.post("/api/runs").status_code == 405  # nothing can change a run
    assert client.delete(f"/api/runs/{run_id}").status_code == 405
    compare = client.get(f"/api/compare?run={run_id}").json()
    assert compare["runs"][0]["run_id"] == run_id and "loss" in compare["metric_names"]
    static = client.get("/static/vendor/uPlot.iife.min.js")
    assert static.status_code == 200 and len(static.content) > 10_000

    scrape = client.get("/metrics")
    assert scrape.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(scrape.text)}
    value = {(f.name, tuple(sorted(s.labels.items()))): s.value
             for f in families.values() for s in f.samples}  # fmt: skip
    run = (("run_id", run_id),)
    assert value[("fedweave_rounds_completed", run)] == 6
    assert value[("fedweave_round_in_flight", run)] == 7
    assert value[("fedweave_run_stalled", run)] == 1
    assert value[("fedweave_site_late_in_a_row", (("run_id", run_id), ("site", "hospital-c")))] == 3
    assert value[("fedweave_round_sites", (("outcome", "late"), ("run_id", run_id)))] == 1
    assert value[("fedweave_round_metric", (("metric", "federated.auc"), ("run_id", run_id)))] \
        == pytest.approx(1 - 0.5 / 6)
    assert value[("fedweave_sites_connected", run)] == 2
    # a DP run's ledger (issue 33): a curve of the run page and a gauge
    assert value[("fedweave_round_metric", (("metric", "privacy.epsilon"), ("run_id", run_id)))] \
        == 3.0
    assert "privacy.epsilon" in client.get(f"/api/runs/{run_id}").json()["metric_names"]
    build = (("flwr", flwr.__version__), ("version", fedweave.__version__))
    assert value[("fedweave_build_info", build)] == 1  # the Flower it runs on (issue 79)
    store.close()


def test_credentials_gate_everything(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    run_id = _history(url)
    auth = tmp_path / "auth"
    auth.write_text(credential_line("ops", "correct horse") + "\n")
    store = open_store(url, read_only=True)
    client = TestClient(make_app(Views(store, AlertRules()), Credentials.load(auth)))
    for path in ("/", f"/runs/{run_id}", "/api/runs", "/metrics", "/static/app.js", "/nope"):
        denied = client.get(path)
        assert denied.status_code == 401, path
        assert run_id not in denied.text and "hospital" not in denied.text
        assert denied.headers["www-authenticate"].startswith("Basic")
    wrong = base64.b64encode(b"ops:wrong").decode()
    assert client.get("/api/runs", headers={"authorization": f"Basic {wrong}"}).status_code == 401
    assert client.get("/api/runs", headers={"authorization": "Bearer wrong"}).status_code == 401
    good = base64.b64encode(b"ops:correct horse").decode()
    assert client.get("/api/runs", headers={"authorization": f"Basic {good}"}).status_code == 200
    other = base64.b64encode(b"eve:correct horse").decode()  # the password is ops'
    assert client.get("/api/runs", headers={"authorization": f"Basic {other}"}).status_code == 401
    assert client.get("/metrics", headers={"authorization": "Bearer correct horse"}).status_code \
        == 200
    store.close()


def test_exposure_rules(tmp_path: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    with pytest.raises(UserError, match="needs TLS and a credential: give --tls-dir and --auth"):
        exposure("0.0.0.0:8080", "--address", None, None)
    with pytest.raises(UserError, match="give --auth-file"):
        exposure("0.0.0.0:8080", "--address", tmp_path, None)
    with pytest.raises(UserError, match="is not HOST:PORT"):
        exposure("8080", "--address", None, None)
    (tmp_path / "bad").write_text("ops:plain-password\n")
    with pytest.raises(UserError, match="line 1 is not NAME:scrypt:SALT:HASH"):
        Credentials.load(tmp_path / "bad")
    with pytest.raises(UserError, match="cannot read it"):
        Credentials.load(tmp_path / "missing")


def _fedweave(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedweave.cli", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=timeout)  # fmt: skip


def _one_line_error(done: subprocess.CompletedProcess, *needles: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_the_command_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    _history(url)
    _one_line_error(_fedweave("dashboard", "--db", "postgresql+psycopg://u:secret@127.0.0.1:1/x",
                              cwd=tmp_path), "127.0.0.1:1", "u:***@")  # fmt: skip
    _one_line_error(_fedweave("dashboard", "--db", url, "--address", "0.0.0.0:8080",
                              cwd=tmp_path), "--tls-dir and --auth-file")  # fmt: skip
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        taken_line = _fedweave("dashboard", "--db", url, "--address", f"127.0.0.1:{port}",
                               cwd=tmp_path)  # fmt: skip
        _one_line_error(taken_line, f"127.0.0.1:{port}", "pick another port")
    old = tmp_path / "old.db"  # a history of an older schema: the migrate hint, nothing changed
    from sqlalchemy import create_engine

    from fedweave.history.migrate import downgrade

    open_store(f"sqlite:///{old}").close()
    engine = create_engine(f"sqlite:///{old}")
    downgrade(engine, f"sqlite:///{old}", "0004")
    engine.dispose()
    before = hashlib.sha256(old.read_bytes()).hexdigest()
    _one_line_error(_fedweave("dashboard", "--db", f"sqlite:///{old}", cwd=tmp_path),
                    "has schema 0004", "fedweave history migrate")  # fmt: skip
    assert hashlib.sha256(old.read_bytes()).hexdigest() == before
    _one_line_error(_fedweave("dashboard", "--db", url, "--auth-file", str(tmp_path / "none"),
                              cwd=tmp_path), "cannot read it")  # fmt: skip
    # the coordinator's and the site's endpoints hold to the same rules
    assert _fedweave("certs", "init", "--out", "tls", "--host", "localhost",
                     cwd=tmp_path).returncode == 0  # fmt: skip
    _one_line_error(_fedweave("coordinator", "--tls-dir", "tls", "--metrics-address",
                              "0.0.0.0:9100", "--db", url, "--allow-unregistered-sites",
                              cwd=tmp_path),
                    "--metrics-address 0.0.0.0:9100", "give --auth-file")  # fmt: skip
    import numpy as np

    np.savez(tmp_path / "x.npz", x=np.zeros((20, 64), np.float32), y=np.arange(20) % 10)
    _one_line_error(_fedweave("client", "--coordinator", "127.0.0.1:9", "--data", "x.npz",
                              "--insecure", "--status-address", "0.0.0.0:8081", cwd=tmp_path),
                    "--status-address 0.0.0.0:8081", "loopback")  # fmt: skip


def test_served_over_tls_with_a_credential(tmp_path: Path) -> None:
    """The real command: HTTPS with the coordinator's certificate, basic auth, Ctrl-C."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    run_id = _history(url)
    assert _fedweave("certs", "init", "--out", "tls", "--host", "localhost",
                     cwd=tmp_path).returncode == 0  # fmt: skip
    made = _fedweave("dashboard", "add-credential", "prometheus", "--auth-file", "auth",
                     cwd=tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr
    password = made.stdout.strip().splitlines()[-1]
    assert password not in (tmp_path / "auth").read_text()  # only its hash is kept
    assert (tmp_path / "auth").stat().st_mode & 0o777 == 0o600
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedweave.cli", "dashboard", "--db", url, "--address",
         f"127.0.0.1:{port}", "--tls-dir", "tls", "--auth-file", "auth"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    context = ssl.create_default_context(cafile=str(tmp_path / "tls" / "ca.pem"))
    context.check_hostname = False  # the certificate names localhost; we dial 127.0.0.1

    def get(path: str, token: str | None) -> tuple[int, str]:
        request = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, context=context, timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, _ = get("/api/runs", None)
                break
            except (urllib.error.URLError, ConnectionError, ssl.SSLError):
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.3)
        assert status == 401
        status, body = get("/api/runs", password)
        assert status == 200 and run_id in body
        status, body = get("/metrics", password)
        assert status == 200 and "fedweave_rounds_completed" in body
    finally:
        proc.send_signal(2)  # Ctrl-C
        out, err = proc.communicate(timeout=30)
    assert proc.returncode in (0, 130), err
    assert "Traceback" not in err, err
    assert f"https://127.0.0.1:{port}/" in err


def test_the_site_journal_keeps_what_the_site_did() -> None:
    from fedweave.client.site_status import SiteJournal, status_app

    journal = SiteJournal("hospital-a", "coord:9092", {"require_secure_agg": True})
    journal.connected("connected", "node 7")
    journal.add({"kind": "train", "part": "training", "run": 5, "round": "1", "outcome": "ok",
                 "examples": 120, "metrics": {"train_loss": 0.4}, "masked": True})  # fmt: skip
    journal.add({"kind": "evaluate", "part": "evaluation", "run": 5, "round": "1",
                 "outcome": "ok", "examples": 12,
                 "metrics": {"loss": 0.3, "auc": 0.9}})  # fmt: skip
    journal.add({"kind": "train", "run": 5, "round": "2", "outcome": "rejected",
                 "reason": "update norm 1e9 above --max-update-norm 100"})  # fmt: skip
    journal.add({"kind": "train", "run": "x" * 10, "outcome": "weird", "metrics": "junk",
                 "reason": "y" * 5000})  # untrusted shapes are bounded, not crashes
    journal.run_ended(5)
    view = journal.view()
    run = view["runs"][0]
    counts = (run["run"], run["rounds_trained"], run["examples"], run["evaluations"])
    assert counts == ("5", 1, 120, 1)  # Flower's run ids are 64-bit: kept as text
    assert run["evaluation_metrics"] == {"loss": 0.3, "auc": 0.9} and run["ended"]
    assert view["problems"][1]["reason"].startswith("update norm")
    assert view["problems"][0]["outcome"] == "failed" and len(view["problems"][0]["reason"]) == 300
    assert view["connection"]["state"] == "connected"
    client = TestClient(status_app(journal))
    assert client.get("/api/status").json()["site"] == "hospital-a"
    assert client.get("/api/status").json()["privacy_floor"] == {"require_secure_agg": True}
    assert 'data-page="status"' in client.get("/").text
    assert client.post("/api/status").status_code == 405


def test_vendored_chart_library_is_the_recorded_release() -> None:
    vendor = REPO / "fedweave" / "dashboard" / "static" / "vendor"
    for line in (vendor / "VENDOR.sha256").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256((vendor / name).read_bytes()).hexdigest() == digest, name
    assert "MIT License" in (vendor / "uPlot.LICENSE").read_text()


def test_a_database_that_goes_away_is_a_503_with_its_reason(pg_url: str) -> None:
    """A real PostgreSQL history whose tables vanish under the dashboard: every API answer is
    503 with the one-line reason (the page shows it and keeps polling), never a traceback."""
    run_id = _history(pg_url)
    store = open_store(pg_url, read_only=True)
    client = TestClient(make_app(Views(store, AlertRules())), raise_server_exceptions=False)
    assert client.get(f"/api/runs/{run_id}").status_code == 200
    from sqlalchemy import create_engine, text

    engine = create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE site_results, checkpoints, rounds, runs, alembic_version"))
    engine.dispose()
    for path in ("/api/runs", f"/api/runs/{run_id}", "/metrics"):
        answer = client.get(path)
        assert answer.status_code == 503, (path, answer.text)
        assert "history database" in answer.json()["error"] and "Traceback" not in answer.text
    page = client.get("/")
    assert page.status_code == 503 and "history unavailable" in page.text
    store.close()


def test_a_gossip_run_reads_as_peers_exchanges_drops_and_consensus(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    store = open_store(url)
    run_id = store.start_run("gossip", "digits", {"command": "simulate"}, 0)
    for number in (1, 2):
        for peer, accuracy in (("peer-a", 0.5), ("peer-b", 0.7), ("peer-c", 0.9)):
            missed = 1 if (peer, number) == ("peer-c", 2) else 0
            store.record_round(run_id, RoundRecord(
                number, peer, NOW, NOW + timedelta(seconds=2), 2, 2 - missed, missed, {},
                1 - accuracy, accuracy * number / 2, bytes_in=1000, bytes_out=2000,
                extra={"drops": {"late": number}, "consensus_estimate": 0.1 / number},
            ), [SiteResult("peer-x", "failed" if missed else "ok", 10)])  # fmt: skip
    store.close()
    views = Views(open_store(url, read_only=True), AlertRules())
    page = views.run(run_id)
    second = page["rounds"][1]
    counts = (second["peers"], second["exchanges"], second["answered"], second["missed"])
    assert counts == (3, 6, 5, 1)
    assert second["drops"] == 6 and second["bytes_out"] == 6000
    assert second["metrics"]["consensus"] == pytest.approx(0.05)
    assert second["metrics"]["accuracy"] == pytest.approx(0.7)  # the peers' mean
    peers = {p["peer"]: p for p in page["peers"]}
    assert peers["peer-c"]["missed"] == 1 and peers["peer-a"]["last_round"] == 2
    assert page["alerts"]["any"] is False
    compared = views.compare([run_id])["runs"][0]["rounds"]
    assert compared[0]["metrics"]["accuracy"] == pytest.approx(0.35)


def test_a_loopback_dashboard_answers_only_requests_that_name_this_machine(tmp_path: Path) -> None:
    """DNS rebinding: a page at rebind.example, whose name its owner points at 127.0.0.1,
    makes the browser send ``Host: rebind.example``; the real server refuses it (421) and
    answers the loopback names and the bound address."""
    from fedweave.dashboard.security import Exposure
    from fedweave.dashboard.server import BackgroundServer, bind

    url = f"sqlite:///{tmp_path / 'h.db'}"
    _history(url)
    store = open_store(url, read_only=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serving = Exposure("127.0.0.1", port)
    assert exposure(f"127.0.0.1:{port}", "--address", None, None).host_names == {
        "127.0.0.1", "localhost", "::1"
    }  # fmt: skip
    sock = bind(serving, "--address")
    server = BackgroundServer(
        make_app(Views(store, AlertRules()), hosts=serving.host_names), serving, sock
    )
    try:

        def status(host: str) -> int:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/api/runs",
                                             headers={"Host": host})  # fmt: skip
            deadline = time.monotonic() + 10
            while True:
                try:
                    with urllib.request.urlopen(request, timeout=5) as answer:
                        return answer.status
                except urllib.error.HTTPError as refused:
                    return refused.code
                except urllib.error.URLError:  # not listening yet
                    assert time.monotonic() < deadline
                    time.sleep(0.1)

        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST"):
            assert status(host) == 200, host
        for host in (f"rebind.example:{port}", "127.0.0.1.rebind.example", f"10.0.0.1:{port}"):
            assert status(host) == 421, host
    finally:
        server.close()
        store.close()


def test_loopback_is_decided_by_the_addresses_a_name_resolves_to(monkeypatch) -> None:
    """A ``localhost`` made to resolve elsewhere is not trusted by its name."""
    import fedweave.dashboard.security as security

    assert is_loopback("localhost")  # here it resolves to 127.0.0.1 / ::1
    elsewhere = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.5", 0))]
    monkeypatch.setattr(security.socket, "getaddrinfo", lambda *args, **kwargs: elsewhere)
    assert not is_loopback("localhost")
    with pytest.raises(UserError, match="needs TLS and a credential"):
        exposure("localhost:8080", "--address", None, None)


def test_an_unknown_name_costs_the_same_check_as_a_known_one(tmp_path, monkeypatch) -> None:
    """Login timing says nothing of which names exist: a wrong password for an unknown name
    is hashed as a known name's is (the issue measured 16 ms against 186 ms)."""
    import fedweave.dashboard.security as security

    (tmp_path / "auth").write_text(credential_line("ops", "correct horse") + "\n")
    credentials = Credentials.load(tmp_path / "auth")
    hashed = []
    real = security._hash
    monkeypatch.setattr(security, "_hash", lambda *args: hashed.append(1) or real(*args))

    def basic(name: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()

    assert not credentials.allows(basic("ops", "wrong"))
    assert len(hashed) == 1
    assert not credentials.allows(basic("nobody", "correct horse"))
    assert len(hashed) == 2
    assert credentials.allows(basic("ops", "correct horse"))


def test_failed_logins_wait_longer_each_time_by_source_and_by_name() -> None:
    from fedweave.dashboard.security import FREE_FAILURES, MAX_WAIT_SECONDS, FailedLogins

    now = [100.0]
    logins = FailedLogins(clock=lambda: now[0])
    for _ in range(FREE_FAILURES):
        assert logins.wait("10.0.0.9", "ops") == 0
        logins.failed("10.0.0.9", "ops")
    assert logins.wait("10.0.0.9", "ops") == 1.0  # then 1 s, doubling with each failure
    assert logins.wait("10.0.0.7", "ops") == 1.0  # the name waits from any source
    assert logins.wait("10.0.0.9", None) == 1.0  # the source waits whatever it claims
    assert logins.wait("10.0.0.7", "eve") == 0
    now[0] += 1.0
    logins.failed("10.0.0.9", "ops")
    assert logins.wait("10.0.0.9", "ops") == 2.0
    for _ in range(20):
        logins.failed("10.0.0.9", "ops")
    assert logins.wait("10.0.0.9", "ops") == MAX_WAIT_SECONDS
    logins.succeeded("10.0.0.9", "ops")
    assert logins.wait("10.0.0.9", "ops") == 0


def test_a_guessing_source_gets_429_without_a_check_while_a_logged_in_user_is_served(
    tmp_path: Path, monkeypatch
) -> None:
    import fedweave.dashboard.security as security

    url = f"sqlite:///{tmp_path / 'h.db'}"
    _history(url)
    (tmp_path / "auth").write_text(credential_line("ops", "correct horse") + "\n")
    store = open_store(url, read_only=True)
    client = TestClient(make_app(Views(store, AlertRules()), Credentials.load(tmp_path / "auth")))
    good = {"authorization": "Basic " + base64.b64encode(b"ops:correct horse").decode()}
    assert client.get("/api/runs", headers=good).status_code == 200  # logged in, remembered
    hashed = []
    real = security._hash
    monkeypatch.setattr(security, "_hash", lambda *args: hashed.append(1) or real(*args))
    for attempt in range(security.FREE_FAILURES):
        wrong = {"authorization": "Basic " + base64.b64encode(f"ops:{attempt}".encode()).decode()}
        assert client.get("/api/runs", headers=wrong).status_code == 401
    assert len(hashed) == security.FREE_FAILURES
    refused = client.get("/api/runs", headers={"authorization": "Bearer one more"})
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert len(hashed) == security.FREE_FAILURES  # refused without a check
    assert client.get("/api/runs", headers=good).status_code == 200  # still served
    store.close()
