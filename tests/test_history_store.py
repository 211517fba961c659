"""The history store against real SQLite files and a real PostgreSQL server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

import fedweave
from fedweave.errors import UserError
from fedweave.history import (
    CheckpointRef,
    DuplicateRoundError,
    HistoryError,
    HistoryUnavailableError,
    RoundRecord,
    SiteResult,
    open_store,
)

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 11, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)


def _record(number: int, actor: str = "coordinator", acc: float = 0.5) -> RoundRecord:
    return RoundRecord(
        round=number, actor=actor, started_at=T0 + timedelta(minutes=number),
        ended_at=T0 + timedelta(minutes=number, seconds=30), sampled=3, replied=2, failed=1,
        train_metrics={"train_loss": 1.0 / number}, eval_loss=2.0 / number, eval_accuracy=acc,
        model_sha256=f"{number:064x}", bytes_in=1000 * number, bytes_out=2000, extra={"n": number},
    )


def _sites(number: int) -> list[SiteResult]:
    return [
        SiteResult("site-a", "ok", 100, {"train_loss": 0.5, "steps": number}, 1.5),
        SiteResult("site-b", "ok", 50, {"train_loss": 0.7}, 2.5),
        SiteResult("site-c", "failed", 0, {}, None, "timed out after 60 s"),
    ]


def _child(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_round_trip_of_runs_rounds_sites_and_checkpoints(db_url: str) -> None:
    with open_store(db_url) as store:
        config = {"lr": 0.05, "rounds": 3, "nested": {"clip": 8}, "bad": float("nan")}
        run_id = store.start_run("federated", "digits", config, seed=7)
        for number in (1, 2):
            ckpt = CheckpointRef(number, f"/ckpt/r{number}.npz", f"{number:064x}", 4096 + number)
            store.record_round(run_id, _record(number, acc=0.4 + number / 10), _sites(number),
                               ckpt)
        store.record_round(run_id, _record(3), [])  # a round without checkpoint or sites

        info = store.get_run(run_id)
        assert (info.mode, info.task, info.seed, info.status) == ("federated", "digits", 7,
                                                                   "running")
        assert info.config == {"lr": 0.05, "rounds": 3, "nested": {"clip": 8}, "bad": None}
        assert info.code_version == fedweave.__version__
        assert info.pid == os.getpid() and info.hostname == socket.gethostname()
        assert info.rounds_completed == 3 and info.actors == 1

        rounds = store.rounds(run_id)
        assert [r["round"] for r in rounds] == [1, 2, 3]
        first = rounds[0]
        assert first["started_at"] == T0 + timedelta(minutes=1)
        assert first["ended_at"].tzinfo is not None and first["seconds"] == 30.0
        assert (first["sampled"], first["replied"], first["failed"]) == (3, 2, 1)
        assert first["train_metrics"] == {"train_loss": 1.0}
        assert first["eval_accuracy"] == pytest.approx(0.5)
        assert first["model_sha256"] == f"{1:064x}" and first["bytes_in"] == 1000
        assert first["extra"] == {"n": 1}
        assert first["checkpoint_path"] == "/ckpt/r1.npz"
        assert rounds[2]["checkpoint_path"] is None

        sites = store.site_results(run_id, round=2)
        assert [(s["site_id"], s["status"], s["num_examples"]) for s in sites] == [
            ("site-a", "ok", 100), ("site-b", "ok", 50), ("site-c", "failed", 0)]
        assert sites[0]["metrics"] == {"train_loss": 0.5, "steps": 2}
        assert sites[2]["reason"] == "timed out after 60 s"
        assert len(store.site_results(run_id)) == 6

        assert store.latest_checkpoint(run_id) == CheckpointRef(2, "/ckpt/r2.npz",
                                                                f"{2:064x}", 4098)
        store.finish_run(run_id, "completed")
        done = store.get_run("latest")
        assert done.run_id == run_id and done.status == "completed" and done.ended_at is not None


def test_gossip_peers_share_a_run_and_latest_means_last_started(db_url: str) -> None:
    with open_store(db_url) as store:
        older = store.start_run("federated", "digits", {}, None)
        run_id = store.start_run("gossip", "digits", {"peers": 2}, None, run_id="gossip01")
        assert run_id == "gossip01"
        for peer, acc in (("peer-1", 0.6), ("peer-2", 0.8)):
            for number in (1, 2):
                neighbours = [SiteResult("peer-2" if peer == "peer-1" else "peer-1")]
                ckpt = CheckpointRef(number, f"/{peer}/{number}.npz", "ab" * 32, 10)
                store.record_round(run_id, _record(number, peer, acc), neighbours, ckpt)
        assert [(r["actor"], r["round"]) for r in store.rounds(run_id)] == [
            ("peer-1", 1), ("peer-1", 2), ("peer-2", 1), ("peer-2", 2)]
        assert [r["eval_accuracy"] for r in store.rounds(run_id, actor="peer-2")] == [0.8, 0.8]
        assert store.latest_checkpoint(run_id, actor="peer-1").path == "/peer-1/2.npz"
        assert store.get_run("latest").run_id == "gossip01"
        assert store.get_run("latest").actors == 2
        assert store.get_run(older[:6]).run_id == older  # unique prefix
        assert [r.run_id for r in store.list_runs()] == ["gossip01", older]
        with pytest.raises(HistoryError, match="already exists"):
            store.start_run("gossip", "digits", {}, None, run_id="gossip01")


def test_unknown_runs_are_user_errors(db_url: str) -> None:
    with open_store(db_url) as store:
        with pytest.raises(UserError, match="no runs recorded"):
            store.get_run("latest")
        with pytest.raises(UserError, match="'nope' is not in"):
            store.get_run("nope")
        with pytest.raises(UserError, match="no run 'ghost'"):
            store.record_round("ghost", _record(1), [])


def test_an_end_only_if_running_keeps_an_end_recorded_first(db_url: str) -> None:
    """The ServerApp calls a run failed only where the coordinator has not ended it first
    (an operator's stop makes Flower's grid raise in the ServerApp)."""
    with open_store(db_url) as store:
        stopped = store.start_run("federated", "digits", {}, 0)
        store.finish_run(stopped, "interrupted", "stopped by operator carol")
        store.finish_run(stopped, "failed", "run not running", only_if_running=True)
        assert (store.get_run(stopped).status, store.get_run(stopped).reason) == (
            "interrupted", "stopped by operator carol"
        )  # fmt: skip
        running = store.start_run("federated", "digits", {}, 0)
        store.finish_run(running, "failed", "boom", only_if_running=True)
        assert store.get_run(running).status == "failed"


def test_duplicate_round_is_refused_and_writes_nothing(db_url: str) -> None:
    with open_store(db_url) as store:
        run_id = store.start_run("federated", "digits", {}, 1)
        store.record_round(run_id, _record(1), _sites(1)[:1], CheckpointRef(1, "/a", "aa", 1))
        heartbeat = store.get_run(run_id).heartbeat_at
        again = _record(1)
        again.eval_accuracy = 0.99
        with pytest.raises(DuplicateRoundError, match="round 1 of actor 'coordinator'"):
            store.record_round(run_id, again, _sites(1), CheckpointRef(1, "/b", "bb", 2))
        assert [r["eval_accuracy"] for r in store.rounds(run_id)] == [0.5]
        assert [s["site_id"] for s in store.site_results(run_id)] == ["site-a"]
        assert store.latest_checkpoint(run_id).path == "/a"
        assert store.get_run(run_id).heartbeat_at == heartbeat  # rolled back as well
        # the same round number of another actor is a different row
        store.record_round(run_id, _record(1, actor="peer-x"), [])
        assert len(store.rounds(run_id)) == 2


def test_a_failure_inside_the_transaction_leaves_no_partial_round(db_url: str) -> None:
    with open_store(db_url) as store:
        run_id = store.start_run("federated", "digits", {}, 1)
        # Two results for one site violate a constraint after the round row was inserted.
        clash = [SiteResult("site-a"), SiteResult("site-a")]
        with pytest.raises(HistoryError, match="not recorded"):
            store.record_round(run_id, _record(1), clash, CheckpointRef(1, "/c", "cc", 3))
        assert store.rounds(run_id) == []
        assert store.site_results(run_id) == []
        assert store.latest_checkpoint(run_id) is None
        if db_url.startswith("postgresql"):  # PostgreSQL enforces lengths: refused at once
            started = time.monotonic()
            with pytest.raises(HistoryError, match="refused the write"):
                store.record_round(run_id, _record(1, actor="p" * 300), [], retry_seconds=30)
            assert time.monotonic() - started < 5
        store.record_round(run_id, _record(1), _sites(1), CheckpointRef(1, "/c", "cc", 3))
        assert len(store.rounds(run_id)) == 1 and len(store.site_results(run_id)) == 3


def test_recording_refreshes_the_heartbeat_and_revives_a_false_interrupted(db_url) -> None:
    with open_store(db_url) as store:
        run_id = store.start_run("gossip", "digits", {}, 1)
        started = store.get_run(run_id).heartbeat_at
        store.finish_run(run_id, "interrupted", "heartbeat looked stale")
        time.sleep(0.01)
        store.record_round(run_id, _record(1, "peer-a"), [])
        revived = store.get_run(run_id)
        assert revived.status == "running" and revived.reason is None
        assert revived.ended_at is None and revived.heartbeat_at > started
        store.finish_run(run_id, "completed")
        store.record_round(run_id, _record(1, "peer-b"), [])  # a late peer still lands
        assert store.get_run(run_id).status == "completed"
        with pytest.raises(ValueError, match="status must be one of"):
            store.finish_run(run_id, "done")


START_AND_HANG = """
import sys, time
from fedweave.history import open_store
store = open_store(sys.argv[1])
print(store.start_run("federated", "digits", {}, 3), flush=True)
time.sleep(60)
"""


def test_run_of_a_killed_process_shows_interrupted_at_next_open(db_url: str) -> None:
    child = _child(START_AND_HANG, db_url)
    try:
        dead_id = child.stdout.readline().strip()
        assert dead_id, child.stderr.read()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    with open_store(db_url) as store:
        assert store.get_run(dead_id).status == "interrupted"
        assert "died (found at a later start)" in store.get_run(dead_id).reason
        live_id = store.start_run("federated", "digits", {}, 3)
        remote_stale = store.start_run("gossip", "digits", {}, 3)
        remote_fresh = store.start_run("gossip", "digits", {}, 3)
    engine = create_engine(db_url)
    with engine.begin() as conn:
        for run_id, age in ((remote_stale, 3600), (remote_fresh, 5)):
            conn.execute(text("UPDATE runs SET hostname = 'elsewhere', pid = 1, "
                              "heartbeat_at = :at WHERE run_id = :id"),
                         {"at": datetime.now(timezone.utc) - timedelta(seconds=age),
                          "id": run_id})
    engine.dispose()
    with open_store(db_url) as store:
        status = {run.run_id: run.status for run in store.list_runs()}
        assert status == {dead_id: "interrupted", live_id: "running",
                          remote_stale: "interrupted", remote_fresh: "running"}
        store.mark_running(dead_id)  # a resume takes the run over
        resumed = store.get_run(dead_id)
        assert (resumed.status, resumed.pid, resumed.reason) == ("running", os.getpid(), None)


def test_unreachable_or_wrong_urls_fail_at_open_with_masked_password(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(UserError) as caught:
        open_store(f"postgresql+psycopg://alice:s3cret-pw@127.0.0.1:{port}/history")
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert "s3cret-pw" not in message and f"alice:***@127.0.0.1:{port}/history" in message
    assert "\n" not in message
    with pytest.raises(UserError, match="does not exist"):
        open_store(f"sqlite:///{tmp_path}/missing-dir/h.db")
    with pytest.raises(UserError, match="not supported"):
        open_store("mysql://bob:pw@db/history")
    with pytest.raises(UserError, match="not a database URL"):
        open_store("history.db")
    with pytest.raises(UserError, match="not a database URL") as caught:
        open_store("postgresql+psycopg://fw:s3cretPW@db.lan:notaport/fw")  # a port, mistyped
    assert "s3cretPW" not in str(caught.value)
    (tmp_path / "text.db").write_text("these are not the tables you are looking for")
    with pytest.raises(UserError, match="must be a writable SQLite file"):
        open_store(f"sqlite:///{tmp_path / 'text.db'}")


def test_wrong_password_against_the_real_server_is_masked(pg_url: str) -> None:
    from sqlalchemy.engine import make_url

    wrong = make_url(pg_url).set(password="not-the-password").render_as_string(False)
    with pytest.raises(HistoryUnavailableError) as caught:
        open_store(wrong)
    assert "not-the-password" not in str(caught.value) and ":***@" in str(caught.value)


def test_record_round_retries_a_locked_sqlite_file_then_gives_up(tmp_path: Path) -> None:
    import sqlite3

    url = f"sqlite:///{tmp_path / 'h.db'}"
    with open_store(url, busy_timeout_ms=50) as store:
        run_id = store.start_run("federated", "digits", {}, 1)
        blocker = sqlite3.connect(tmp_path / "h.db", isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN EXCLUSIVE")
        started = time.monotonic()
        with pytest.raises(HistoryUnavailableError, match="gave up after"):
            store.record_round(run_id, _record(1), [], retry_seconds=0.8)
        assert 0.5 < time.monotonic() - started < 5
        threading.Timer(0.5, blocker.rollback).start()  # the lock goes away within the budget
        store.record_round(run_id, _record(1), _sites(1), retry_seconds=10)
        blocker.close()
        assert len(store.rounds(run_id)) == 1


class _Proxy:
    """A TCP relay to PostgreSQL that the test can cut and restore (a real lost network)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target, self.port = target, 0
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self.port, self._listener = listener.getsockname()[1], listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        if self._listener is not None:
            try:  # wakes the thread blocked in accept() (close alone does not, on Linux)
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        for sock in self._sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self._sockets = []


def test_postgres_lost_mid_run_is_retried_then_reported(pg_url: str) -> None:
    from sqlalchemy.engine import make_url

    real = make_url(pg_url)
    proxy = _Proxy((real.host, real.port))
    proxy.start()
    url = real.set(host="127.0.0.1", port=proxy.port).render_as_string(False)
    with open_store(url) as store:
        run_id = store.start_run("federated", "digits", {}, 1)
        store.record_round(run_id, _record(1), [])
        proxy.cut()
        with pytest.raises(HistoryUnavailableError, match="gave up after") as caught:
            store.record_round(run_id, _record(2), [], retry_seconds=1)
        assert f":{real.password}@" not in str(caught.value) and ":***@" in str(caught.value)
        threading.Timer(0.7, proxy.start).start()  # the network comes back within the budget
        store.record_round(run_id, _record(2), _sites(2), retry_seconds=15)
        assert [r["round"] for r in store.rounds(run_id)] == [1, 2]
        proxy.cut()


PEER = """
import sys
from datetime import datetime, timezone
from fedweave.history import open_store, RoundRecord, SiteResult, CheckpointRef, HistoryError
url, run_id, peer, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = open_store(url)  # the first use: every peer races to migrate the empty database
try:
    store.start_run("gossip", "digits", {}, 1, run_id=run_id)
except HistoryError:
    pass  # another peer created the shared run first
for n in range(1, rounds + 1):
    now = datetime.now(timezone.utc)
    record = RoundRecord(n, peer, now, now, 2, 2, 0, {"loss": 1 / n}, 0.1, 0.5 + n / 100)
    store.record_round(run_id, record, [SiteResult("left"), SiteResult("right")],
                       CheckpointRef(n, f"/{peer}/{n}.npz", "00" * 32, 1))
store.close()
"""


def test_several_processes_migrate_and_write_one_database_at_once(db_url: str) -> None:
    peers = [_child(PEER, db_url, "shared", f"peer-{i}", "15") for i in range(4)]
    for proc in peers:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    with open_store(db_url) as store:
        rounds = store.rounds("shared")
        assert len(rounds) == 60
        for i in range(4):
            assert [r["round"] for r in rounds if r["actor"] == f"peer-{i}"] == list(range(1, 16))
        assert len(store.site_results("shared")) == 120
        assert store.get_run("shared").actors == 4
        assert len(store.list_runs()) == 1
