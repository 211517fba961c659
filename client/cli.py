"""``fedweave client``: one data-holding site of a real deployment (a Flower SuperNode whose
ClientApp, ``fedweave.client.deployed_app:app``, trains on ``--data`` only). Mounted in
``fedweave/cli.py`` as ``app.command()(client)``.

Everything a site operator can get wrong (data file, CA certificate, site key) is checked
before connecting. Then the SuperNode connects, with Flower's own exponential backoff, and
this process turns its log into a few readable lines: waiting, connected, each round. The
SuperNode runs in its own process group, tied to this process (it gets SIGTERM if we die), and
Ctrl-C or SIGTERM stops the whole group.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import typer

from fedweave.addresses import free_port, parse_host_port
from fedweave.config import Resolved, RunConfig, config_command
from fedweave.flower_patches.launch import command as patched_flower
from fedweave.processes import raise_interrupt, stop_process_group, tied_to_us

OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "PYTHONUNBUFFERED": "1",
}
RETRY_MARK = "Connection attempt failed, retrying in"


def _echo(message: str) -> None:
    typer.echo(message, err=True)


def _check_inputs(
    coordinator: str,
    task: str,
    data: Path,
    label_column: str | None,
    ca_cert: Path | None,
    insecure: bool,
    site_key: Path | None,
    eval_data: Path | None = None,
) -> None:
    """One-line errors for everything checkable before connecting."""
    from fedweave.errors import UserError
    from fedweave.learning.data import load_site_data
    from fedweave.learning.task import load_task

    parse_host_port(coordinator, "--coordinator", "coord.example.org:9092")
    if "'" in str(data):
        raise UserError(f"--data path {data} contains a single quote; rename or move the file")
    load_site_data(data, load_task(task), label_column)  # missing/bad file: clear error here
    if eval_data is not None:
        if "'" in str(eval_data):
            raise UserError(
                f"--eval-data path {eval_data} contains a single quote; rename or move the file"
            )
        load_site_data(eval_data, load_task(task), label_column)
    if insecure and ca_cert is not None:
        raise UserError("--insecure and --ca-cert contradict each other; give one")
    if not insecure:
        if ca_cert is None:
            raise UserError(
                "TLS is on by default: pass --ca-cert ca.pem (the coordinator's "
                "`fedweave certs init` wrote it) or --insecure"
            )
        try:
            if b"BEGIN CERTIFICATE" not in ca_cert.read_bytes():
                raise UserError(f"{ca_cert} is not a PEM certificate; use the coordinator's ca.pem")
        except OSError as exc:
            raise UserError(f"cannot read --ca-cert {ca_cert} ({exc.strerror or exc})") from None
    if site_key is not None:
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.serialization import load_ssh_private_key

        try:
            key = load_ssh_private_key(site_key.read_bytes(), None)
        except OSError as exc:
            raise UserError(f"cannot read --site-key {site_key} ({exc.strerror or exc})") from None
        except (ValueError, TypeError):
            key = None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise UserError(
                f"{site_key} is not a site key; "
                "make one with `fedweave sites new-key --out site.key`"
            )


def supernode_command(
    coordinator: str,
    task: str,
    data: Path,
    ca_cert: Path | None,
    site_key: Path | None,
    connect_timeout: float,
    runtime_port: int,
    label_column: str | None = None,
    device: str | None = None,
    external_worker: bool = False,
    name: str | None = None,
    eval_data: Path | None = None,
    eval_fraction: float = 0.1,
) -> list[str]:
    """The ``flower-supernode`` command line for this site (``external_worker``: its
    ClientApps run in ``fedweave.client.worker``, not in a new process per message)."""
    from fedweave.contract import (
        NODE_DATA_PATH_KEY,
        NODE_DEVICE_KEY,
        NODE_EVAL_DATA_KEY,
        NODE_EVAL_FRACTION_KEY,
        NODE_LABEL_COLUMN_KEY,
        NODE_SITE_NAME_KEY,
        NODE_TASK_KEY,
    )

    node_config = f"{NODE_DATA_PATH_KEY}='{data.resolve()}' {NODE_TASK_KEY}='{task}'"
    if label_column:
        node_config += f" {NODE_LABEL_COLUMN_KEY}='{label_column}'"
    if device:
        node_config += f" {NODE_DEVICE_KEY}='{device}'"
    if name:
        node_config += f" {NODE_SITE_NAME_KEY}='{name}'"
    if eval_data is not None:
        node_config += f" {NODE_EVAL_DATA_KEY}='{eval_data.resolve()}'"
    node_config += f" {NODE_EVAL_FRACTION_KEY}='{eval_fraction:g}'"
    cmd = [
        *patched_flower("flower-supernode"),
        "--superlink",
        coordinator,
        "--node-config",
        node_config,
        "--port",
        str(runtime_port),
        "--max-wait-time",
        str(connect_timeout),
    ]
    cmd += ["--root-certificates", str(ca_cert.resolve())] if ca_cert else ["--insecure"]
    if external_worker:
        cmd += ["--isolation", "process"]
    if site_key is not None:
        cmd += ["--auth-supernode-private-key", str(site_key.resolve())]
    return cmd


class _LogFollower:
    """Copies the SuperNode's output to a log file and echoes the lines a site operator needs."""

    def __init__(self, stream, log_path: Path, coordinator: str, verbose: bool) -> None:
        self.stream, self.coordinator, self.verbose = stream, coordinator, verbose
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed by the thread
        self.connected = False
        self.lost = False
        self.refused = False
        self.last_error = ""
        self.thread = threading.Thread(target=self._run, name="supernode-log", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        rounds_seen: set[str] = set()
        for raw in self.stream:
            line = raw.rstrip()
            self.log.write(line + "\n")
            self.log.flush()
            text = line.split(":", 1)[-1].strip() if "\x1b" in line else line.strip()
            if self.verbose:
                _echo(line)
            if RETRY_MARK in line:
                wait = line.split(RETRY_MARK, 1)[1].strip()
                state = "lost; reconnecting" if self.connected else "unreachable; retrying"
                self.lost = self.connected
                _echo(f"coordinator {self.coordinator} {state} in {wait}")
            elif "SuperNode ID:" in line:
                self.connected, self.lost = True, False
                _echo(f"connected to {self.coordinator} as node {text.rsplit(':', 1)[-1].strip()}")
            elif "[RUN " in line and "ROUND" in line and line not in rounds_seen:
                rounds_seen.add(line)
                _echo(f"taking part in {text.strip('[]').lower()}")
            elif "Failed to activate SuperNode" in line:
                self.refused = True
            elif "ERROR" in line or "Exit Code" in line or "exit code" in line:
                self.last_error = text
        self.log.close()


PROBE_EVERY_S = 5.0
"""While the site is not connected (or has lost its coordinator), it probes the coordinator's
address this often (``client/reachability.py``)."""


def _wait_probing(
    proc: subprocess.Popen,
    follower: _LogFollower,
    coordinator: str,
    ca_cert: Path | None,
    has_connected: bool,
) -> int:
    """Wait for the SuperNode to exit, probing the coordinator while this site is not
    connected to it: before it ever connected (``has_connected``), a certificate or name that
    cannot work ends the site at once with its own line; a coordinator that is not there (yet,
    or any more), or anything once the site has taken part, is said once per change (a
    long-running site rides out a DNS or certificate hiccup)."""
    from fedweave.client.reachability import explained, probe
    from fedweave.errors import UserError

    host, port = parse_host_port(coordinator, "--coordinator", "coord.example.org:9092")
    said, next_probe = "ok", time.monotonic()
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        waiting = not follower.connected or follower.lost
        if not waiting or time.monotonic() < next_probe:
            if not waiting:
                said = "ok"
            continue
        found = probe(host, port, ca_cert)
        next_probe = time.monotonic() + PROBE_EVERY_S
        if found.fatal and not has_connected:
            raise UserError(explained(found, coordinator, ca_cert))
        if found.kind != said and found.kind != "ok":
            if follower.lost and found.kind == "refused":
                _echo(
                    f"the coordinator at {coordinator} is not running (connection refused): "
                    "its run ended or it stopped; this site waits for it to start again "
                    "(Ctrl-C to stop)"
                )
            else:
                _echo(f"waiting: {explained(found, coordinator, ca_cert)}")
        said = found.kind


def _start_supernode(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """The SuperNode under the process-tree guard: its SuperExec and ``flwr-clientapp``
    processes (which Flower leaves behind, retrying forever, when the SuperNode dies) end
    with it, and the guard ends with us (see ``fedweave/procguard.py``, stdlib only)."""
    guarded = [sys.executable, "-m", "fedweave.procguard", "--", *command]
    return subprocess.Popen(
        guarded,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        text=True,
        errors="replace",
        **tied_to_us(),
    )


def run_site(
    command: list[str],
    coordinator: str,
    log_path: Path,
    connect_timeout: float,
    verbose: bool = False,
    worker: list[str] | None = None,
    key_fingerprint: str | None = None,
    ca_cert: Path | None = None,
) -> int:
    """Run the SuperNode until it exits or we are stopped; returns our exit code.

    ``worker``: the command of the site's ClientApp worker, kept running beside the SuperNode
    (``WorkerSupervisor``); None when the SuperNode starts its own ClientApp processes.
    ``key_fingerprint``: the site key's ``SHA256:...``, shown when the coordinator refuses it
    (its console shows the same fingerprint).
    ``ca_cert``: the CA the coordinator's certificate must verify with (None: no TLS); the
    site probes the coordinator with it while not connected (``_wait_probing``).

    A SuperNode whose key the coordinator has not registered (yet) exits at once; the site
    then tries again with growing waits until ``connect_timeout``, because sites are often
    started before the coordinator's operator has added their key.

    A SuperNode that exits after it had connected is started again: a restarted coordinator
    keeps no Flower state (``fedweave.coordinator.superlink``), so it refuses this site's old
    node id and Flower's SuperNode exits; the site then joins as a new node. Waits between
    such restarts grow from 2 s to 30 s while they keep coming within a minute.
    """
    from fedweave.errors import UserError

    env = dict(os.environ)
    for key, value in OFFLINE_ENV.items():
        env.setdefault(key, value)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    _echo(f"site starting: connecting to {coordinator} (log: {log_path})")
    started, wait, rejoin_wait = time.monotonic(), 2.0, 2.0
    refusals, has_connected = 0, False
    proc: subprocess.Popen | None = None
    supervisor = None
    try:
        if worker is not None:
            from fedweave.client.worker_supervisor import WorkerSupervisor

            supervisor = WorkerSupervisor(worker, env, log_path, _echo).start()
        while True:
            proc = _start_supernode(command, env)
            follower = _LogFollower(proc.stdout, log_path, coordinator, verbose)
            launched = time.monotonic()
            code = _wait_probing(proc, follower, coordinator, ca_cert, has_connected)
            has_connected = has_connected or follower.connected
            stop_process_group(proc)
            follower.thread.join(5)
            if follower.connected:
                rejoin_wait = 2.0 if time.monotonic() - launched > 60 else rejoin_wait
                _echo(
                    f"coordinator {coordinator} dropped this site (restarted?); "
                    f"rejoining in {rejoin_wait:.0f} s"
                )
                time.sleep(rejoin_wait)
                started, wait, rejoin_wait = time.monotonic(), 2.0, min(rejoin_wait * 2, 30.0)
                continue
            left = connect_timeout - (time.monotonic() - started)
            if not follower.refused or left <= 0:
                break
            key = f"key {key_fingerprint}" if key_fingerprint else "key"
            _echo(
                f"coordinator {coordinator} refused this site's {key}: not registered there "
                "(send site.pub to its operator: `fedweave sites add-key DIR site.pub`), "
                "revoked, or this site's clock is off; retrying in "
                f"{min(wait, left):.0f} s, for {left:.0f} s more (--connect-timeout)"
                if not refusals
                else f"coordinator {coordinator} refused this site again; retrying in "
                f"{min(wait, left):.0f} s"
            )
            refusals += 1
            time.sleep(min(wait, left))
            wait = min(wait * 2, 30.0)
    except KeyboardInterrupt:
        _echo("stopping the site")
        if proc is not None:
            stop_process_group(proc)
        _echo("site stopped")
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc is not None:
            stop_process_group(proc)
        if supervisor is not None:
            supervisor.stop()
    if follower.refused:
        raise UserError(
            f"coordinator {coordinator} refused this site: its key is not registered there; "
            "send site.pub to the coordinator (`fedweave sites add-key DIR site.pub`) and retry "
            "(a registered site is refused too when its clock is more than 5 s ahead of the "
            "coordinator's: synchronise it with NTP)"
        )
    if not follower.connected and code != 0:
        from fedweave.client.reachability import explained, probe

        waited = time.monotonic() - started
        found = probe(*parse_host_port(coordinator, "--coordinator", "host:port"), ca_cert)
        why = explained(found, coordinator, ca_cert) or (
            f"{follower.last_error or 'no answer'}; check the address, the firewall, "
            "--ca-cert, and that the coordinator runs"
        )
        raise UserError(
            f"coordinator {coordinator} unreachable for {waited:.0f} s "
            f"(--connect-timeout {connect_timeout:g}): {why}"
        )
    if code != 0:
        raise UserError(
            f"the site stopped (exit {code}): {follower.last_error or 'see ' + str(log_path)}"
        )
    return 0


def _site_key_fingerprint(site_key: Path | None) -> str | None:
    """``SHA256:...`` of the site key's public half (what the coordinator's console shows)."""
    if site_key is None:
        return None
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key

    from fedweave.certs import public_key_fingerprint

    key = load_ssh_private_key(site_key.read_bytes(), None)  # checked in _check_inputs
    return public_key_fingerprint(key.public_key())


def site_name(given: str | None, site_key: Path | None) -> str:
    """This site's name: ``--name``, else its site key's file name, else the host name."""
    from fedweave.contract import SITE_NAME_PATTERN
    from fedweave.errors import UserError

    if given is not None:
        if not SITE_NAME_PATTERN.match(given):
            raise UserError(
                f"--name {given!r}: use 1-64 letters, digits, '.', '_' or '-' "
                "(e.g. hospital-a)"
            )
        return given
    if site_key is not None:
        return site_key.stem
    host = socket.gethostname().split(".")[0]
    return host if SITE_NAME_PATTERN.match(host) else "site"


def _client(config: RunConfig, _resolved: Resolved) -> None:
    from fedweave.errors import UserError

    data, connection, site = config.data, config.connection, config.site
    if data.data is None:
        raise UserError("--data is required: this site's .npz or .csv file")
    coordinator = site.coordinator or ""
    _check_inputs(
        coordinator, data.task, data.data, data.label_column, connection.ca_cert,
        connection.insecure, connection.site_key, config.evaluation.eval_data,
    )  # fmt: skip
    from fedweave.client.worker_supervisor import worker_command
    from fedweave.flower_patches import clientapp_worker_usable, correctness_problem

    problem = correctness_problem("supernode_waits")  # the SuperNode would refuse to start
    if problem is not None:
        raise UserError(problem)
    runtime_port = site.runtime_port or free_port()
    use_worker = clientapp_worker_usable()
    command = supernode_command(
        coordinator,
        data.task,
        data.data,
        None if connection.insecure else connection.ca_cert,
        connection.site_key,
        connection.connect_timeout,
        runtime_port,
        data.label_column,
        config.training.device,
        external_worker=use_worker,
        name=site_name(site.name, connection.site_key),
        eval_data=config.evaluation.eval_data,
        eval_fraction=config.evaluation.eval_fraction,
    )
    worker = None
    if use_worker:
        runtime_api = f"127.0.0.1:{runtime_port}"
        worker = worker_command(runtime_api, data.task, data.data, data.label_column)
    else:
        _echo(
            "warning: Flower's own executor runs this site's ClientApps (FEDWEAVE_STOCK_FLOWER=1, "
            "or Flower's per-message functions differ from flwr 1.41.0's): it loads whatever app "
            "a run names, without fedweave's check that only fedweave's own app runs here"
        )
    code = run_site(
        command, coordinator, site.log_file, connection.connect_timeout, config.output.verbose,
        worker, _site_key_fingerprint(connection.site_key),
        None if connection.insecure else connection.ca_cert,
    )  # fmt: skip
    raise typer.Exit(code)


client = config_command(
    "client",
    _client,
    """Run a site: connect to the coordinator and train on --data when asked.

    Example:

        fedweave client --coordinator coord.example.org:9092 --data site.npz --ca-cert ca.pem
    """,
)
