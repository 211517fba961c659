"""``fedweave client``: one data-holding site of a real deployment (a Flower SuperNode whose
ClientApp, ``fedweave.client.deployed_app:app``, trains on ``--data`` only). Mounted in
``fedweave/cli.py`` as ``app.command()(client)``.

Everything a site operator can get wrong (data file, CA certificate, site key) is checked
before connecting: the options and files here (``site_checks.py``), the task and the data by
the site's ClientApp worker as it starts, before the SuperNode does (this process does not
import torch). Then the SuperNode connects, with Flower's own
exponential backoff, and this process turns the events it reports
(``fedweave.flower_patches.supernode_state``: data in a file, not its log, which is copied for
people) into a few readable lines: waiting, connected, each round, a run's end. The
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
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import typer

from fedweave.addresses import free_port, parse_host_port
from fedweave.config import Resolved, RunConfig, config_command
from fedweave.flower_patches.launch import command as patched_flower
from fedweave.flower_patches.refused_keys import KEYS_STILL_REGISTERING_STATUS
from fedweave.private_files import open_private
from fedweave.processes import raise_interrupt, stop_process_group, tied_to_us

OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "PYTHONUNBUFFERED": "1",
}


def _echo(message: str) -> None:
    typer.echo(message, err=True)


def privacy_floor(config) -> dict[str, str]:
    """This site's privacy floor (``--require-secure-agg``, ``--require-dp``,
    ``--max-epsilon``) and its own ledger (``--privacy-ledger``) as node-config entries,
    which ``client/mods.py``'s ``privacy_floor`` and the sample-DP trainer enforce on every
    training round."""
    from fedweave.contract import (
        NODE_MAX_DELTA_KEY,
        NODE_MAX_EPSILON_KEY,
        NODE_PRIVACY_LEDGER_KEY,
        NODE_REQUIRE_DP_KEY,
        NODE_REQUIRE_SECURE_AGG_KEY,
    )

    floor: dict[str, str] = {}
    if config.site.require_secure_agg:
        floor[NODE_REQUIRE_SECURE_AGG_KEY] = "true"
    if config.site.require_dp != "off":
        floor[NODE_REQUIRE_DP_KEY] = config.site.require_dp
    if config.privacy.max_epsilon is not None:
        floor[NODE_MAX_EPSILON_KEY] = repr(float(config.privacy.max_epsilon))
    if config.site.max_delta is not None:
        floor[NODE_MAX_DELTA_KEY] = repr(float(config.site.max_delta))
    floor[NODE_PRIVACY_LEDGER_KEY] = str(site_ledger_path(config).resolve())
    return floor


def personal_state_entry(config) -> dict[str, str]:
    """This site's folder of local layers (``--personal-state``, else ``DATA.personal`` beside
    its data file) as a node-config entry."""
    from fedweave.contract import NODE_PERSONAL_STATE_KEY

    data = config.data.data
    folder = config.site.personal_state or data.with_name(data.name + ".personal")
    return {NODE_PERSONAL_STATE_KEY: str(Path(folder).resolve())}


def site_choice_entries(config) -> dict[str, str]:
    """The site's other tasks (``--more-tasks``) and its policy file (``--policy``) as
    node-config entries: the site's ClientApp serves and refuses runs by them."""
    from fedweave.client.site_checks import more_tasks
    from fedweave.client.worker_supervisor import more_tasks_entry
    from fedweave.contract import NODE_MORE_TASKS_KEY, NODE_POLICY_KEY

    entries = {}
    tasks = more_tasks(config)
    if tasks:
        entries[NODE_MORE_TASKS_KEY] = more_tasks_entry(tasks)
    if config.site.policy is not None:
        entries[NODE_POLICY_KEY] = str(config.site.policy.resolve())
    return entries


def site_ledger_path(config) -> Path:
    """This site's own sample-DP ledger: ``--privacy-ledger``, else beside its data file (the
    ledger is that data's: what it has spent across every run)."""
    given = config.site.privacy_ledger
    if given is not None:
        return given
    data = config.data.data
    return data.with_name(data.name + ".privacy-ledger.json")


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
    floor: dict[str, str] | None = None,
    columns: Path | None = None,
    base_model: Path | None = None,
    nproc: int = 1,
) -> list[str]:
    """The ``flower-supernode`` command line for this site (``external_worker``: its
    ClientApps run in ``fedweave.client.worker``, not in a new process per message;
    ``floor``: the site's privacy floor as node-config entries, ``privacy_floor``;
    ``columns``: its column map, ``--columns``; ``base_model``: ``--base-model``;
    ``nproc``: ``--nproc-per-node``)."""
    from fedweave.contract import (
        NODE_BASE_MODEL_KEY,
        NODE_CA_CERT_KEY,
        NODE_COLUMNS_KEY,
        NODE_COORDINATOR_KEY,
        NODE_DATA_PATH_KEY,
        NODE_DEVICE_KEY,
        NODE_EVAL_DATA_KEY,
        NODE_EVAL_FRACTION_KEY,
        NODE_LABEL_COLUMN_KEY,
        NODE_NPROC_KEY,
        NODE_SITE_NAME_KEY,
        NODE_TASK_KEY,
    )

    node_config = f"{NODE_DATA_PATH_KEY}='{data.resolve()}' {NODE_TASK_KEY}='{task}'"
    if label_column:
        node_config += f" {NODE_LABEL_COLUMN_KEY}='{label_column}'"
    if columns is not None:
        node_config += f" {NODE_COLUMNS_KEY}='{columns.resolve()}'"
    if base_model is not None:
        node_config += f" {NODE_BASE_MODEL_KEY}='{base_model.resolve()}'"
    if device:
        node_config += f" {NODE_DEVICE_KEY}='{device}'"
    if nproc > 1:
        node_config += f" {NODE_NPROC_KEY}='{nproc}'"
    if name:
        node_config += f" {NODE_SITE_NAME_KEY}='{name}'"
    if eval_data is not None:
        node_config += f" {NODE_EVAL_DATA_KEY}='{eval_data.resolve()}'"
    node_config += f" {NODE_EVAL_FRACTION_KEY}='{eval_fraction:g}'"
    node_config += f" {NODE_COORDINATOR_KEY}='{coordinator}'"  # direct transfers go there
    if ca_cert:
        node_config += f" {NODE_CA_CERT_KEY}='{ca_cert.resolve()}'"
    for key, value in (floor or {}).items():
        node_config += f" {key}='{value}'"
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


class _LogCopier:
    """Copies the SuperNode's output to the site's log file (for people: nothing is decided
    from it), and to stderr with ``--verbose``."""

    def __init__(self, stream: IO[str], log_path: Path, verbose: bool) -> None:
        self.stream, self.verbose = stream, verbose
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open_private(log_path, "a", encoding="utf-8")  # closed by the thread
        self.thread = threading.Thread(target=self._run, name="supernode-log", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for raw in self.stream:
            line = raw.rstrip()
            self.log.write(line + "\n")
            self.log.flush()
            if self.verbose:
                _echo(line)
        self.log.close()


@dataclass
class _SupernodeState:
    """What one SuperNode process has reported (``fedweave.flower_patches.supernode_state``).

    Attributes:
        connected: it activated its node with the coordinator.
        lost: connected, then its requests started failing (the coordinator went away).
        refused: why the coordinator refused this site (``unknown-key``, ``needs-key``,
            ``signature``), or None.
        failure: its last request that gave up before it connected (the event), or None.
        tls_failed: that request failed in the TLS handshake.
        went_down: while lost, a probe found nothing listening at the coordinator's address
            (its process stopped). A coordinator that listens there again is a new one,
            which knows none of the old one's nodes: the site rejoins at once.
    """

    connected: bool = False
    lost: bool = False
    went_down: bool = False
    refused: str | None = None
    failure: dict[str, Any] | None = None
    tls_failed: bool = False


class _SupernodeEvents:
    """Reads the events a SuperNode appends to ``path`` and says the ones a site operator
    needs, in one line each.

    Args:
        path: the state file named in the SuperNode's ``FEDWEAVE_SUPERNODE_STATE_FILE``.
        coordinator: the coordinator's ``HOST:PORT``, for the lines said.
    """

    def __init__(self, path: Path, coordinator: str, journal=None) -> None:
        self.path, self.coordinator, self.journal = path, coordinator, journal
        self.state = _SupernodeState()
        self.offset = 0
        self.rounds_seen: set[tuple[int, str]] = set()

    def poll(self) -> _SupernodeState:
        """Apply the events appended since the last poll; the state after them."""
        from fedweave.flower_patches.supernode_state import read_events

        events, self.offset = read_events(self.path, self.offset)
        for event in events:
            self._apply(event)
        return self.state

    def _apply(self, event: dict[str, Any]) -> None:
        self._note(event)
        state, kind = self.state, event["event"]
        if kind == "connected":
            state.connected, state.lost, state.went_down, state.failure = True, False, False, None
            _echo(f"connected to {self.coordinator} as node {event.get('node_id')}")
        elif kind == "retrying":
            wait = _number(event.get("wait_s"))
            state.lost = state.connected
            if state.connected:
                how = "lost; reconnecting"
            elif event.get("http_status") == KEYS_STILL_REGISTERING_STATUS:
                how = "still registering its sites' keys; trying again"
            else:
                how = "unreachable; retrying"
            _echo(f"coordinator {self.coordinator} {how} in {wait:.1f} s")
        elif kind == "recovered" and state.lost:
            state.lost, state.went_down = False, False
            _echo(f"coordinator {self.coordinator} answers again")
        elif kind == "refused":
            state.refused = str(event.get("why", "unknown-key"))
        elif kind == "gave-up" and not state.connected:
            state.failure = event
            state.tls_failed = event.get("error") == "tls"
        elif kind == "message":
            run_round = (_integer(event.get("run_id")), str(event.get("round", "")))
            if run_round not in self.rounds_seen:
                self.rounds_seen.add(run_round)
                run, round_id = run_round
                _echo(f"taking part in run {run}" + (f", round {round_id}" if round_id else ""))
        elif kind == "run-ended":
            _echo(f"run {_integer(event.get('run_id'))} ended; waiting for the next run")

    def _note(self, event: dict[str, Any]) -> None:
        """Tell the status view (``--status-address``) what the event changes."""
        if self.journal is None:
            return
        kind = event["event"]
        if kind == "connected":
            self.journal.connected("connected", f"node {event.get('node_id')}")
        elif kind == "retrying" and self.state.connected:
            self.journal.connected("lost", "reconnecting")
        elif kind == "recovered":
            self.journal.connected("connected")
        elif kind == "refused":
            self.journal.connected("refused", str(event.get("why", "unknown-key")))
        elif kind == "run-ended":
            self.journal.run_ended(_integer(event.get("run_id")))


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _integer(value: object) -> int:
    return int(value) if isinstance(value, int) else 0


def _failure_text(state: _SupernodeState, code: int) -> str:
    """What ended a SuperNode that never connected, from its last failed request (the
    event) or its exit code (Flower's ``ExitCode``)."""
    failure = state.failure
    if failure is not None:
        detail = str(failure.get("error", "unknown"))
        if "tls_verify_code" in failure:
            detail += f", OpenSSL verify code {failure['tls_verify_code']}"
        if "flower_code" in failure:
            detail += f", Flower error code {failure['flower_code']}"
        return f"its {failure.get('call', 'request')} request failed ({detail})"
    from fedweave.flower_patches.supernode_state import exit_code_name

    return f"Flower's SuperNode exited with code {code} ({exit_code_name(code)})"


PROBE_EVERY_S = 5.0
"""While the site is not connected (or has lost its coordinator), it probes the coordinator's
address this often (``client/reachability.py``)."""
RESTART_PROBE_S = 1.0
"""Once the lost coordinator's port refuses connections (its process stopped), the site
probes this often, to rejoin as soon as a coordinator listens there again."""


def _wait_probing(
    proc: subprocess.Popen,
    events: _SupernodeEvents,
    coordinator: str,
    ca_cert: Path | None,
    has_connected: bool,
    connected_by: float | None = None,
) -> int | None:
    """Wait for the SuperNode to exit, following its events and probing the coordinator
    while this site is not connected to it: before it ever connected (``has_connected``), a
    certificate or name that cannot work ends the site at once with its own line; a
    coordinator that is not there (yet, or any more), or anything once the site has taken
    part, is said once per change (a long-running site rides out a DNS or certificate
    hiccup). A refused site's SuperNode ends itself.

    Returns the SuperNode's exit status, or None (the caller then stops it) once
    ``connected_by`` (a ``time.monotonic`` moment) has passed with the SuperNode not
    connected, or once a lost coordinator that went down listens again (``went_down``):
    Flower's SuperNode would only learn that on its next retry, then be refused its old node
    id and exit."""
    from fedweave.client.reachability import explained, probe
    from fedweave.errors import UserError

    host, port = parse_host_port(coordinator, "--coordinator", "coord.example.org:9092")
    said, next_probe = "ok", time.monotonic()
    while True:
        try:
            code = proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            code = None
        state = events.poll()
        if code is not None:
            return code
        if connected_by is not None and not state.connected and time.monotonic() > connected_by:
            return None
        if state.tls_failed:
            next_probe, state.tls_failed = time.monotonic(), False  # explain it now
        waiting = not state.connected or state.lost
        if not waiting or time.monotonic() < next_probe:
            if not waiting:
                said = "ok"
            continue
        found = probe(host, port, ca_cert)
        if state.went_down and found.kind == "ok":
            return None
        state.went_down = state.went_down or (state.lost and found.kind == "refused")
        next_probe = time.monotonic() + (RESTART_PROBE_S if state.went_down else PROBE_EVERY_S)
        if found.fatal and not has_connected:
            raise UserError(explained(found, coordinator, ca_cert))
        if found.kind != said and found.kind != "ok":
            if state.lost and found.kind == "refused":
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


WORKER_INPUTS_TIMEOUT_S = 180.0
"""How long a starting site waits for its ClientApp worker to read the task and data (torch's
import and a table's read: ~5 s on an idle 2-core machine) before it ends, naming the log."""
REFUSED_PATIENCE_S = 8.0
"""How long a site that never connected tries again after its first refusal before it ends
(the error then comes within 30 s of the start). A site that comes while its coordinator is
still registering the sites' keys is not refused but told to try again (HTTP
``KEYS_STILL_REGISTERING_STATUS``); this patience covers a key registered at a running
coordinator's next look at ``DIR/sites`` and a retry that is slow to start."""
RETRY_VERDICT_S = 15.0
"""A retry after a refusal gets at least this long from its SuperNode's start to be answered:
starting a SuperNode took over 6 s on a loaded 2-core machine, and the patience above ran out
while the retry that would have connected (its key registered meanwhile) was still starting."""


def refusal_text(why: str, coordinator: str, site_key: Path | None, fingerprint: str | None) -> str:
    """One line: why ``coordinator`` refused this site and what to do about it.

    Args:
        why: the refusal's reason code (``fedweave.flower_patches.supernode_state``).
        coordinator: the coordinator's ``HOST:PORT``.
        site_key: this site's private key file (``--site-key``), None without one.
        fingerprint: the key's ``SHA256:...`` (the coordinator's console shows the same).
    """
    from fedweave.certs import public_key_path

    pub = public_key_path(site_key) if site_key is not None else Path("site.pub")
    if why == "needs-key":
        return (
            f"coordinator {coordinator} admits registered sites only and this site has no "
            "key: make one (`fedweave sites new-key --out site.key`), send site.pub to the "
            "coordinator's operator (`fedweave sites add-key DIR site.pub`) and start this "
            "site with --site-key site.key"
        )
    if why == "signature":
        return (
            f"coordinator {coordinator} rejected this site's signed requests (HTTP 401): "
            "this site's clock is more than 5 s ahead of or 305 s behind the coordinator's; "
            "synchronise it with NTP"
        )
    key = f" ({fingerprint})" if fingerprint else ""
    return (
        f"coordinator {coordinator} refused this site: its key is not registered there{key}; "
        f"send {pub} to the coordinator's operator (`fedweave sites add-key DIR {pub.name}`), "
        "then start this site again (a revoked key is refused the same way)"
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
    site_key: Path | None = None,
    journal=None,
) -> int:
    """Run the SuperNode until it exits or we are stopped; returns our exit code.

    ``worker``: the command of the site's ClientApp worker, kept running beside the SuperNode
    (``WorkerSupervisor``); None when the SuperNode starts its own ClientApp processes. The
    SuperNode starts once the worker has read the task and data; their problem, if any, ends
    the site (``UserError``) before it connects.
    ``key_fingerprint``: the site key's ``SHA256:...``, shown when the coordinator refuses it
    (its console shows the same fingerprint).
    ``ca_cert``: the CA the coordinator's certificate must verify with (None: no TLS); the
    site probes the coordinator with it while not connected (``_wait_probing``).
    ``site_key``: this site's private key file; a refusal names its ``.pub`` to send.
    ``journal``: the status view's ``SiteJournal`` (``--status-address``), told the
    connection's changes and every record the worker reports; None without one.

    The SuperNode reports connected, refused, retrying and a finished run as events in a
    state file beside the log (``fedweave.flower_patches.supernode_state``); the log itself
    is only copied. A site the coordinator refuses before it ever connected (its key is not
    registered) says so at once, naming the key file to send, tries again for
    ``REFUSED_PATIENCE_S`` (each retry is heard out for ``RETRY_VERDICT_S``), then ends
    with that line; one refused after it had taken
    part (its key revoked, or its clock off) tries again with growing waits until
    ``connect_timeout``.

    A SuperNode that exits after it had connected is started again: a restarted coordinator
    keeps no Flower state (``fedweave.coordinator.command.superlink``), so it refuses this
    site's old node id and Flower's SuperNode exits; the site then joins as a new node. A
    coordinator seen down (its port refusing connections) and then listening again is joined
    at once (``RESTART_PROBE_S``); otherwise waits between such rejoins grow from 2 s to 30 s
    while they keep coming within a minute.
    """
    from fedweave.errors import UserError
    from fedweave.flower_patches.supernode_state import SUPERNODE_STATE_FILE_ENV

    env = dict(os.environ)
    for key, value in OFFLINE_ENV.items():
        env.setdefault(key, value)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    state_path = log_path.parent / f"{log_path.name}.state.jsonl"
    supernode_env = {**env, SUPERNODE_STATE_FILE_ENV: str(state_path.resolve())}
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    wait, rejoin_wait = 2.0, 2.0
    refusals, has_connected = 0, False
    first_refused: float | None = None
    refused_why: str | None = None
    proc: subprocess.Popen | None = None
    supervisor = None
    try:
        if worker is not None:
            from fedweave.client.worker_supervisor import WorkerSupervisor

            supervisor = WorkerSupervisor(
                worker, env, log_path, _echo, journal.add if journal is not None else None
            ).start()
            problem = supervisor.inputs_problem(WORKER_INPUTS_TIMEOUT_S)
            if problem is not None:
                raise UserError(problem)
        _echo(f"site starting: connecting to {coordinator} (log: {log_path})")
        started = time.monotonic()
        while True:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            state_path.write_bytes(b"")  # each SuperNode reports from a clean file
            proc = _start_supernode(command, supernode_env)
            copier = _LogCopier(proc.stdout, log_path, verbose)  # type: ignore[arg-type]
            events = _SupernodeEvents(state_path, coordinator, journal)
            launched = time.monotonic()
            refused_until = (
                None if first_refused is None or has_connected
                else max(first_refused + min(REFUSED_PATIENCE_S, connect_timeout),
                         launched + RETRY_VERDICT_S)
            )  # fmt: skip
            code = _wait_probing(proc, events, coordinator, ca_cert, has_connected, refused_until)
            stop_process_group(proc)
            copier.thread.join(5)
            state = events.poll()
            has_connected = has_connected or state.connected
            if state.connected and state.went_down:
                _echo(f"coordinator {coordinator} restarted; rejoining now")
                started, wait = time.monotonic(), 2.0
                continue
            if state.connected:
                rejoin_wait = 2.0 if time.monotonic() - launched > 60 else rejoin_wait
                _echo(
                    f"coordinator {coordinator} dropped this site (restarted?); "
                    f"rejoining in {rejoin_wait:.0f} s"
                )
                time.sleep(rejoin_wait)
                started, wait, rejoin_wait = time.monotonic(), 2.0, min(rejoin_wait * 2, 30.0)
                continue
            if code is None and refused_why is not None:  # patience ran out mid-attempt
                raise UserError(refusal_text(refused_why, coordinator, site_key, key_fingerprint))
            if state.refused is None:
                break
            refused_why = state.refused
            now = time.monotonic()
            first_refused = now if first_refused is None else first_refused
            if has_connected:
                left, until = connect_timeout - (now - started), "--connect-timeout"
            else:
                left = min(REFUSED_PATIENCE_S, connect_timeout) - (now - first_refused)
                until = "a key just added at the coordinator is registered within a second"
            if left <= 0:
                break
            _echo(
                f"{refusal_text(state.refused, coordinator, site_key, key_fingerprint)}; "
                f"trying again in {min(wait, left):.0f} s, for {left:.0f} s more ({until})"
                if not refusals
                else f"coordinator {coordinator} refused this site again; trying again in "
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
    if state.refused is not None:
        raise UserError(refusal_text(state.refused, coordinator, site_key, key_fingerprint))
    if not state.connected and code != 0:
        from fedweave.client.reachability import explained, probe

        waited = time.monotonic() - started
        found = probe(*parse_host_port(coordinator, "--coordinator", "host:port"), ca_cert)
        why = explained(found, coordinator, ca_cert) or (
            f"{_failure_text(state, code)}; check the address, the firewall, "
            "--ca-cert, and that the coordinator runs"
        )
        raise UserError(
            f"coordinator {coordinator} unreachable for {waited:.0f} s "
            f"(--connect-timeout {connect_timeout:g}): {why}"
        )
    if code != 0:
        raise UserError(f"the site stopped: {_failure_text(state, code)}; see {log_path}")
    return 0


def _site_key_fingerprint(site_key: Path | None) -> str | None:
    """``SHA256:...`` of the site key's public half (what the coordinator's console shows)."""
    if site_key is None:
        return None
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key

    from fedweave.certs import public_key_fingerprint

    key = load_ssh_private_key(site_key.read_bytes(), None)  # checked in site_checks.py
    return public_key_fingerprint(key.public_key())


def site_name(given: str | None, site_key: Path | None) -> str:
    """This site's name: ``--name``, else its site key's file name, else the host name."""
    from fedweave.contract import SITE_NAME_PATTERN
    from fedweave.errors import UserError

    if given is not None:
        if not SITE_NAME_PATTERN.match(given):
            raise UserError(
                f"--name {given!r}: use 1-64 letters, digits, '.', '_' or '-' (e.g. hospital-a)"
            )
        return given
    if site_key is not None:
        return site_key.stem
    host = socket.gethostname().split(".")[0]
    return host if SITE_NAME_PATTERN.match(host) else "site"


def _client(config: RunConfig, _resolved: Resolved) -> None:
    from fedweave.client.site_checks import check_site_data, check_site_inputs, more_tasks
    from fedweave.errors import UserError

    data, connection, site = config.data, config.connection, config.site
    coordinator = site.coordinator or ""
    check_site_inputs(config)  # the options' rules ran as they were resolved
    from fedweave.client.worker_supervisor import worker_command
    from fedweave.flower_patches import (
        clientapp_worker_usable,
        correctness_problem,
        internal_use_problem,
    )

    use_worker = clientapp_worker_usable()
    if not use_worker:  # else the worker reads the task and data as it starts (run_site)
        check_site_data(config)

    for patch in ("supernode_waits", "supernode_state"):  # the SuperNode would refuse to start
        problem = correctness_problem(patch)
        if problem is not None:
            raise UserError(problem)
    problem = internal_use_problem("message_records")  # the site's mods read Flower's records
    if problem is not None:
        raise UserError(problem)
    name = site_name(site.name, connection.site_key)
    runtime_port = site.runtime_port or free_port()
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
        name=name,
        eval_data=config.evaluation.eval_data,
        eval_fraction=config.evaluation.eval_fraction,
        floor={**privacy_floor(config), **personal_state_entry(config),
               **site_choice_entries(config)},  # fmt: skip
        columns=data.columns,
        base_model=config.site.base_model,
        nproc=config.training.nproc_per_node,
    )
    journal = status = None
    if config.monitoring.status_address is not None:
        from fedweave.client.site_status import SiteJournal, serve_status

        journal = SiteJournal(
            name, coordinator,
            {"require_secure_agg": config.site.require_secure_agg,
             "require_dp": config.site.require_dp, "max_epsilon": config.privacy.max_epsilon,
             "max_delta": config.site.max_delta},
        )  # fmt: skip
        serving, status = serve_status(config.monitoring.status_address, journal)
        _echo(f"this site's status at {serving.url}/")
    worker = None
    if use_worker:
        runtime_api = f"127.0.0.1:{runtime_port}"
        worker = worker_command(
            runtime_api,
            data.task,
            data.data,
            data.label_column,
            config.evaluation.eval_data,
            data.columns,
            config.training.device,
            config.training.nproc_per_node,
            more_tasks(config),
        )
    else:
        _echo(
            "warning: Flower's own executor runs this site's ClientApps (FEDWEAVE_STOCK_FLOWER=1, "
            "or Flower's per-message functions differ from flwr 1.42.0's): it loads whatever app "
            "a run names, without fedweave's check that only fedweave's own app runs here"
        )
    if (
        config.site.require_secure_agg or config.site.require_dp != "off"
        or config.privacy.max_epsilon is not None or config.site.max_delta is not None
    ):  # fmt: skip
        _echo(
            "privacy floor: this site trains only in runs with "
            + ", ".join(
                (["SecAgg+"] if config.site.require_secure_agg else [])
                + ([f"--dp {config.site.require_dp}"] if config.site.require_dp != "off" else [])
                + (
                    [f"a ledger at most epsilon {config.privacy.max_epsilon:g} (local and "
                     "sample DP: by this site's own account of its noise)"]
                    if config.privacy.max_epsilon is not None
                    else []
                )
                + (
                    [f"delta at most {config.site.max_delta:g}"]
                    if config.site.max_delta is not None
                    else []
                )
            )  # fmt: skip
        )
    others = more_tasks(config)
    if others:
        _echo(f"this site holds tasks {', '.join([data.task, *others])}: it serves a run of any")
    if site.policy is not None:
        _echo(f"site policy {site.policy}: runs it does not take are refused, with the reason")
    try:
        code = run_site(
            command, coordinator, site.log_file, connection.connect_timeout,
            config.output.verbose, worker, _site_key_fingerprint(connection.site_key),
            None if connection.insecure else connection.ca_cert, connection.site_key, journal,
        )  # fmt: skip
    finally:
        if status is not None:
            status.close()
    raise typer.Exit(code)


client = config_command(
    "client",
    _client,
    """Run a site: connect to the coordinator and train on --data when asked.

    Example:

        fedweave client --coordinator coord.example.org:9092 --data site.npz --ca-cert ca.pem
    """,
)
