"""Bad input for `fedweave coordinator` and `fedweave client`: one line starting with
``error:``, exit code 2, no traceback, and nothing left running."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from test_deploy_support import Processes, free_port, make_deployment, run_fedweave, wait_for


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy-errors")
    make_deployment(root, sites=1)
    return root


def one_line_error(done, *needles: str) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def coordinator(root, port: int, *extra: str):
    return run_fedweave(
        "coordinator",
        "--address",
        f"127.0.0.1:{port}",
        "--rounds",
        "1",
        "--min-clients",
        "3",
        "--db",
        f"sqlite:///{root / 'h.db'}",
        "--state-dir",
        str(root / "state"),
        "--once",
        *extra,
        cwd=root,
    )


def test_coordinator_port_in_use(deployment):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = coordinator(deployment, port, "--tls-dir", "tls")
    one_line_error(done, f"127.0.0.1:{port}", "pick another --address")


def test_coordinator_names_a_bulk_address_it_cannot_use(deployment):
    """``--bulk-address``: not HOST:PORT, the sites' own port, a port in use: one line each,
    before anything starts."""
    port = free_port()
    one_line_error(coordinator(deployment, port, "--tls-dir", "tls", "--bulk-address", "9095"),
                   "--bulk-address '9095' is not HOST:PORT")  # fmt: skip
    one_line_error(
        coordinator(deployment, port, "--tls-dir", "tls", "--bulk-address", f"0.0.0.0:{port}"),
        "uses --address's port",
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        done = coordinator(deployment, port, "--tls-dir", "tls",
                           "--bulk-address", f"127.0.0.1:{taken}")  # fmt: skip
    one_line_error(done, f"127.0.0.1:{taken}", "pick another --bulk-address")


def test_coordinator_unreadable_or_missing_certificates(deployment, tmp_path):
    broken = tmp_path / "tls"
    broken.mkdir()
    for name in ("ca.pem", "server.pem"):
        (broken / name).write_bytes((deployment / "tls" / name).read_bytes())
    (broken / "server.key").mkdir()  # unreadable as a file (tests may run as root)
    one_line_error(
        coordinator(deployment, free_port(), "--tls-dir", str(broken)),
        "cannot read TLS file",
        "server.key",
    )
    (broken / "server.key").rmdir()
    (broken / "server.key").write_text("garbage")
    one_line_error(coordinator(deployment, free_port(), "--tls-dir", str(broken)), "not PEM")
    one_line_error(coordinator(deployment, free_port()), "--tls-dir DIR", "--insecure")
    # an expired certificate (issue 80): refused at once, naming it and the renewal, where
    # Flower's SuperLink started with it and the coordinator ended after 60 s of silence
    from test_certs import _expired_server_certificate

    expired = tmp_path / "expired"
    shutil.copytree(deployment / "tls", expired)
    _expired_server_certificate(expired)
    started = time.monotonic()
    done = coordinator(deployment, free_port(), "--tls-dir", str(expired))
    one_line_error(done, f"{expired / 'server.pem'} expired on", "fedweave certs renew --dir")
    assert time.monotonic() - started < 30


def test_coordinator_database_unreachable(deployment):
    done = run_fedweave(
        "coordinator",
        "--address",
        f"127.0.0.1:{free_port()}",
        "--insecure",
        "--db",
        "postgresql+psycopg://fw:secret@127.0.0.1:1/fw",
        "--once",
        "--state-dir",
        str(deployment / "state"),
        cwd=deployment,
    )
    line = one_line_error(done)
    assert "secret" not in line  # the password is masked
    assert not (deployment / "state" / "superlink.log").exists()  # nothing started


def test_coordinator_refuses_bad_settings_before_starting(deployment):
    one_line_error(coordinator(deployment, free_port(), "--insecure", "--task", "nope"), "nope")
    one_line_error(
        coordinator(deployment, free_port(), "--insecure", "--address", "nohost"), "HOST:PORT"
    )
    state = deployment / "refused-resume-state"
    refused = run_fedweave(
        "coordinator", "--insecure", "--address", f"127.0.0.1:{free_port()}",
        "--min-clients", "3", "--db", f"sqlite:///{deployment / 'h.db'}",
        "--state-dir", str(state), "--once", "--resume", "feedbeef0000", cwd=deployment,
    )  # fmt: skip
    one_line_error(refused, "feedbeef0000")
    assert not state.exists()  # refused before its SuperLink was launched


def test_client_missing_data_file_fails_before_connecting(deployment, monkeypatch):
    """The site's worker reads the task and data and says what is wrong; the site process
    itself never imports a task (CPython's import profile of that one process, on its stderr,
    shows it: a table task imports torch)."""
    started = time.monotonic()
    done = run_fedweave(
        "client",
        "--coordinator",
        "127.0.0.1:1",
        "--data",
        "nowhere.npz",
        "--ca-cert",
        "tls/ca.pem",
        cwd=deployment,
    )
    one_line_error(done, "nowhere.npz", "does not exist")
    assert "connecting" not in done.stderr and time.monotonic() - started < 30
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    table = run_fedweave(
        "client", "--coordinator", "127.0.0.1:1", "--task", "breast-cancer",
        "--data", "nowhere.csv", "--ca-cert", "tls/ca.pem", cwd=deployment,
    )  # fmt: skip
    monkeypatch.delenv("PYTHONPROFILEIMPORTTIME")
    one_line_error(table, "nowhere.csv", "does not exist")
    imported = [line.rsplit("|", 1)[-1].strip() for line in table.stderr.splitlines()]
    assert "typer" in imported, table.stderr[-2000:]
    assert not {"torch", "fedweave.learning.tasks.tabular"} & set(imported)
    missing_eval = run_fedweave(
        "client", "--coordinator", "127.0.0.1:1", "--data", "split/site-0.npz",
        "--eval-data", "held-out.npz", "--ca-cert", "tls/ca.pem", cwd=deployment,
    )  # fmt: skip
    one_line_error(missing_eval, "held-out.npz", "does not exist")
    assert "connecting" not in missing_eval.stderr


def test_client_needs_tls_or_insecure_and_a_real_key(deployment):
    base = ["client", "--coordinator", "127.0.0.1:1", "--data", "split/site-0.npz"]
    one_line_error(run_fedweave(*base, cwd=deployment), "--ca-cert", "--insecure")
    one_line_error(
        run_fedweave(*base, "--ca-cert", "split/test.npz", cwd=deployment), "not a PEM certificate"
    )
    one_line_error(
        run_fedweave(*base, "--ca-cert", "tls/ca.pem", "--site-key", "site0.pub", cwd=deployment),
        "not a site key",
    )


@pytest.mark.slow
def test_client_gives_up_on_an_unreachable_coordinator_after_connect_timeout(deployment):
    port = free_port()  # nothing listens here
    started = time.monotonic()
    done = run_fedweave(
        "client",
        "--coordinator",
        f"127.0.0.1:{port}",
        "--data",
        "split/site-0.npz",
        "--ca-cert",
        "tls/ca.pem",
        "--connect-timeout",
        "6",
        cwd=deployment,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    one_line_error(done, f"127.0.0.1:{port}", "--connect-timeout 6", "nothing listens at")
    assert "unreachable; retrying in" in done.stderr  # the backoff is visible while it waits
    assert f"waiting: nothing listens at 127.0.0.1:{port} (connection refused)" in done.stderr
    assert 5 <= elapsed < 60, elapsed


@pytest.mark.timeout(180)
def test_client_names_a_wrong_ca_at_once(deployment, tmp_path):
    """A coordinator with its own CA, a site given another: the site says so within seconds
    (OpenSSL's verify result), not "unreachable" after its connect timeout."""
    other = tmp_path / "other-ca"
    done = run_fedweave("certs", "init", "--out", str(other), "--host", "localhost",
                        cwd=deployment)  # fmt: skip
    assert done.returncode == 0, done.stderr
    port = free_port()
    procs = Processes(tmp_path)
    try:
        coord = procs.start(
            "coordinator", "coordinator", "--address", f"127.0.0.1:{port}", "--rounds", "1",
            "--min-clients", "3", "--db", f"sqlite:///{tmp_path / 'h.db'}",
            "--state-dir", str(tmp_path / "state"), "--tls-dir", str(deployment / "tls"),
            "--once",
        )  # fmt: skip
        wait_for(
            lambda: "sites connected" in procs.output("coordinator"), 60,
            "the coordinator to listen", coord, lambda: procs.output("coordinator"),
        )  # fmt: skip
        started = time.monotonic()
        done = run_fedweave(
            "client", "--coordinator", f"127.0.0.1:{port}", "--data", "split/site-0.npz",
            "--ca-cert", str(other / "ca.pem"), cwd=deployment, timeout=120,
        )  # fmt: skip
        elapsed = time.monotonic() - started
    finally:
        procs.close()
    one_line_error(done, f"127.0.0.1:{port}", "does not verify", str(other / "ca.pem"))
    assert elapsed < 30, elapsed


@pytest.mark.timeout(180)
def test_client_names_an_unregistered_key_and_the_file_to_send(tmp_path):
    """A site whose key the coordinator does not know: one line naming the key file to send
    its operator, decided from Flower's error code (not its log) and said within 30 s."""
    make_deployment(tmp_path, sites=1, unregistered=1)
    port = free_port()
    procs = Processes(tmp_path)
    try:
        coord = procs.start(
            "coordinator", "coordinator", "--address", f"127.0.0.1:{port}", "--rounds", "1",
            "--min-clients", "3", "--db", f"sqlite:///{tmp_path / 'h.db'}",
            "--state-dir", str(tmp_path / "state"), "--tls-dir", "tls", "--once",
        )  # fmt: skip
        wait_for(
            lambda: "sites connected" in procs.output("coordinator"), 60,
            "the coordinator to listen", coord, lambda: procs.output("coordinator"),
        )  # fmt: skip
        started = time.monotonic()
        done = run_fedweave(
            "client", "--coordinator", f"127.0.0.1:{port}", "--data", "split/site-0.npz",
            "--ca-cert", "tls/ca.pem", "--site-key", "site1.key", "--log-file", "site1.log",
            cwd=tmp_path, timeout=120,
        )  # fmt: skip
        elapsed = time.monotonic() - started
    finally:
        procs.close()
    line = one_line_error(
        done,
        f"coordinator 127.0.0.1:{port} refused this site:",
        "refused this site: its key is not registered there (SHA256:",
        f"send {Path('site1.pub')} to the coordinator's operator",
        "fedweave sites add-key DIR site1.pub",
    )
    print(f"{elapsed:.1f} s: {line}")
    assert elapsed < 30, elapsed
    # said at the first refusal, then tried again briefly (keys are registered as a
    # coordinator starts)
    assert "site1.pub" in done.stderr.split("trying again in", 1)[0], done.stderr


def test_client_names_a_port_that_does_not_speak_tls(deployment):
    """Another service on the port (or a coordinator started with --insecure)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer_in_plain_text() -> None:
            for _ in range(3):  # the site's first probe, and a spare
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                with conn:
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        threading.Thread(target=answer_in_plain_text, daemon=True).start()
        done = run_fedweave(
            "client", "--coordinator", f"127.0.0.1:{port}", "--data", "split/site-0.npz",
            "--ca-cert", "tls/ca.pem", "--connect-timeout", "20", cwd=deployment, timeout=120,
        )  # fmt: skip
    one_line_error(done, f"127.0.0.1:{port}", "not with TLS", "--insecure")


def _survivors(text: str) -> list[int]:
    from test_deploy_support import processes_mentioning

    return processes_mentioning(text)


@pytest.mark.slow
def test_sigterm_stops_coordinator_and_site_cleanly(deployment, tmp_path):
    import signal

    from test_deploy_support import Processes, recorded, wait_for

    port = free_port()
    db = f"sqlite:///{tmp_path / 'stop.db'}"
    procs = Processes(deployment)
    try:
        coord = procs.start(
            "stop-coordinator",
            "coordinator",
            "--address",
            f"127.0.0.1:{port}",
            "--min-clients",
            "3",
            "--db",
            db,
            "--tls-dir",
            "tls",
            "--state-dir",
            str(tmp_path / "state"),
        )

        def start_site(name: str, log_file: Path):
            return procs.start(
                name,
                "client",
                "--coordinator",
                f"127.0.0.1:{port}",
                "--data",
                "split/site-0.npz",
                "--ca-cert",
                "tls/ca.pem",
                "--site-key",
                "site0.key",
                "--log-file",
                str(log_file),
            )

        site = start_site("stop-site", tmp_path / "site.log")
        wait_for(
            lambda: "1/3 sites connected" in procs.output("stop-coordinator"),
            90,
            "the site to connect",
            coord,
            lambda: procs.output("stop-coordinator"),
        )
        site.send_signal(signal.SIGTERM)
        assert site.wait(30) == 0, procs.output("stop-site")
        assert "site stopped" in procs.output("stop-site")

        # kill -9 of a site's command alone: its SuperNode and helpers must not linger.
        site_log = tmp_path / "site-killed.log"
        killed = start_site("killed-site", site_log)
        wait_for(
            lambda: "connected to" in procs.output("killed-site"),
            90,
            "the second site to connect",
            killed,
            lambda: procs.output("killed-site"),
        )
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(10)
        wait_for(
            lambda: (
                not _survivors(str(site_log))
                and not _survivors(str(deployment / "split" / "site-0.npz"))
            ),
            20,
            "the killed site's SuperNode to exit",
            log=lambda: str(_survivors(str(deployment / "split" / "site-0.npz"))),
        )
        coord.send_signal(signal.SIGTERM)
        assert coord.wait(30) == 130, procs.output("stop-coordinator")
        assert "interrupted; continue it with --resume" in procs.output("stop-coordinator")
        leftovers = lambda: _survivors(str(tmp_path)) + _survivors(f"127.0.0.1:{port}")  # noqa: E731
        wait_for(
            lambda: not leftovers(), 15, "Flower processes to exit", log=lambda: str(leftovers())
        )
    finally:
        procs.close()
    assert recorded(db)[2].status == "interrupted"


def test_guard_takes_orphans_down_with_it(tmp_path):
    """The process-tree guard adopts orphans (subreaper) and ends them all on SIGTERM."""
    import signal
    import subprocess
    import sys

    from test_deploy_support import processes_mentioning, wait_for

    marker = str(tmp_path / "orphan-marker")
    script = f'(env FW_MARK="{marker}" sleep 300 &) ; env FW_MARK="{marker}" sleep 301'
    guard = subprocess.Popen(
        [sys.executable, "-m", "fedweave.procguard", "--", "sh", "-c", script],
        start_new_session=True,
    )
    try:
        wait_for(lambda: len(processes_mentioning(marker)) >= 2, 10, "the sleeps to start")
        guard.send_signal(signal.SIGTERM)
        assert guard.wait(15) == 128 + signal.SIGTERM
        wait_for(
            lambda: not processes_mentioning(marker),
            10,
            "the orphaned sleep to die",
            log=lambda: str(processes_mentioning(marker)),
        )
    finally:
        os.killpg(guard.pid, signal.SIGKILL) if guard.poll() is None else None


def test_guard_reaps_orphans_that_exit():
    """An orphan that exits under the guard is reaped (no zombie is left behind it), while the
    guarded command itself is left to the guard's own wait."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from test_deploy_support import wait_for

    from fedweave.procguard import _proc_table

    guard = subprocess.Popen(
        [sys.executable, "-m", "fedweave.procguard", "--", "sh", "-c",
         "for i in 1 2 3; do (sleep 0.2 &) ; done; sleep 300"],
        start_new_session=True,
    )  # fmt: skip
    try:
        children = lambda: [  # noqa: E731
            (pid, state) for pid, (ppid, state) in _proc_table().items() if ppid == guard.pid
        ]
        wait_for(lambda: len(children()) == 1, 10, "the orphans to be reaped",
                 log=lambda: str(children()))  # fmt: skip
        (pid, state), = children()  # only the guarded sh is left, alive
        assert state != "Z" and "sh" in Path(f"/proc/{pid}/cmdline").read_text()
        guard.send_signal(signal.SIGTERM)
        assert guard.wait(15) == 128 + signal.SIGTERM
    finally:
        os.killpg(guard.pid, signal.SIGKILL) if guard.poll() is None else None


@pytest.mark.timeout(180)
def test_a_site_that_comes_before_its_coordinator_registered_its_keys_waits_and_connects(
    tmp_path,
):
    """A site that reaches the SuperLink before the coordinator has registered the sites' keys
    (``docker compose up`` starts both together; a loaded host is slow to register) is told to
    try again, says so, and connects once its key is registered: it is not refused. The
    SuperLink is started as ``fedweave coordinator`` starts it (``launch_superlink`` with the
    key-registration file named), and the test registers the key itself, as the coordinator
    does, only after the site said it would try again."""
    from fedweave.certs import TlsFiles
    from fedweave.coordinator.command.superlink import (
        SuperLinkOptions,
        await_superlink,
        child_env,
        launch_superlink,
    )
    from fedweave.coordinator.command.supervisor import _sync_site_keys
    from fedweave.flower_patches.refused_keys import KEYS_SYNCED_FILE_ENV, REFUSED_KEYS_FILE_ENV
    from fedweave.processes import stop_process_group

    make_deployment(tmp_path, sites=1)
    port = free_port()
    options = SuperLinkOptions(
        "127.0.0.1", port, tmp_path / "state", TlsFiles.in_dir(tmp_path / "tls"), node_auth=True
    )
    synced = tmp_path / "state" / "site-keys-registered"
    refusals = tmp_path / "state" / "refused-keys.jsonl"  # where a refused key is noted
    link = launch_superlink(options, child_env(
        {KEYS_SYNCED_FILE_ENV: str(synced), REFUSED_KEYS_FILE_ENV: str(refusals)}))
    procs = Processes(tmp_path)
    client = None
    try:
        client = await_superlink(options, link)
        site = procs.start("site", "client", "--coordinator", f"127.0.0.1:{port}",
                           "--data", "split/site-0.npz", "--ca-cert", "tls/ca.pem",
                           "--site-key", "site0.key", "--log-file", "site0.log")  # fmt: skip
        wait_for(
            lambda: "still registering its sites' keys" in procs.output("site"), 90,
            "the site to be told the keys are being registered", site,
            lambda: procs.output("site"),
        )  # fmt: skip
        assert _sync_site_keys(client, tmp_path / "tls", {}, {})
        synced.touch()
        wait_for(lambda: "connected to" in procs.output("site"), 60, "the site to connect",
                 site, lambda: procs.output("site"))  # fmt: skip
    finally:
        procs.close()
        if client is not None:
            client.close()
        stop_process_group(link)
    out = procs.output("site")
    assert "refused this site" not in out, out
    assert "unreachable" not in out, out
    assert not refusals.exists(), refusals.read_text()  # the SuperLink refused no key
