"""Flower's deployment engine on the coordinator: start the SuperLink, talk to its Control API,
register site keys, submit our app as a Flower App Bundle (FAB), watch the run.

Path chosen (Flower 1.41): the SuperLink in its default ``--isolation subprocess`` mode starts
Flower's own SuperExec, which starts ``flwr-serverapp`` for each submitted run; that process loads
``fedweave.coordinator.serverapp.deployed_server_app:server_app`` from the installed package. We
submit the run the way ``flwr run`` does (``StartRun`` on the Control API) with a FAB built in
memory whose ``pyproject.toml`` names our ServerApp/ClientApp and carries the run's settings as its
run config (the plan: ``coordinator/plan.py``); no project directory, no ``~/.flwr`` config, no
``flwr`` CLI in between.

In 1.41 the Fleet, Control and Runtime APIs are one HTTPS (protobuf-over-HTTP) server on
``--host/--port``; SuperNodes only speak that (the gRPC Fleet API is a hidden legacy switch).
Flower exports none of the client, messages and bundle builder this takes:
``fedweave.flower_patches.control_api`` holds them behind the version guard.

The SuperLink runs under ``fedweave.procguard`` so that its whole process tree
(SuperExec, ``flwr-serverapp``) ends with the coordinator, even after ``kill -9``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fedweave.addresses import parse_host_port
from fedweave.certs import TlsFiles
from fedweave.contract import CLIENT_APP_REF, SERVER_APP_REF
from fedweave.errors import UserError
from fedweave.flower_patches.launch import command as patched_flower
from fedweave.offline import FLOWER_OFFLINE_ENV
from fedweave.private_files import open_private, write_private_text
from fedweave.processes import stop_process_group, tied_to_us

FAB_PUBLISHER = "fedweave"
FAB_NAME = "fedweave-deploy"

DEPLOY_ENV = {
    **FLOWER_OFFLINE_ENV,
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "PYTHONUNBUFFERED": "1",
}
"""Environment of every Flower process we start: no telemetry, no update checks, no `uv sync`."""


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus ``DEPLOY_ENV`` (explicit settings win) and ``extra``,
    less the history URL an operator may have set (``FEDWEAVE_DB``): secrets reach Flower's
    processes through a 0600 file only (``coordinator/plan.py``: ``write_deployment_file``)."""
    from fedweave.config.sections import DB_URL_ENVVAR

    env = dict(os.environ)
    env.pop(DB_URL_ENVVAR, None)
    for key, value in DEPLOY_ENV.items():
        env.setdefault(key, value)
    env.update(extra or {})
    bin_dir = str(Path(sys.executable).parent)  # flower-* scripts live beside our python
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


def spawn(command: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start a Flower process in its own session, output to ``log_path``, tied to our life."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open_private(log_path, "ab")  # handed to the child; closed when we exit
    return subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        **tied_to_us(),
    )


def log_tail(path: Path, lines: int = 1, needle: str | None = None) -> str:
    """Last ``lines`` non-empty lines of a log (or the last one containing ``needle``)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    text = [line.strip() for line in text if line.strip()]
    if needle is not None:
        text = [line for line in text if needle in line] or text
    return " | ".join(text[-lines:])


def parse_address(address: str) -> tuple[str, int]:
    """``--address HOST:PORT`` → (host, port), refusing anything else in one line."""
    return parse_host_port(address, "--address")


def check_port_free(host: str, port: int, flag: str = "--address") -> None:
    """Fail in one line when ``host:port`` (given as ``flag``) cannot be bound (in use, or not
    this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise UserError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}); stop what uses it or "
                f"pick another {flag}"
            ) from None


@dataclass(frozen=True)
class SuperLinkOptions:
    """How the SuperLink is started.

    Attributes:
        host / port: where the Fleet/Control/Runtime API listens (sites connect here).
        state_dir: keeps ``superlink.log``. Flower's own state (nodes, runs, messages) is kept
            in memory: on disk it cost ~1.1 s of a 3-site round (docs/deploy.md), and nothing
            of it is needed after a restart. fedweave's history and checkpoints carry a run
            across ``--resume``, the site keys are registered again from ``--tls-dir``, and a
            site the restarted SuperLink no longer knows rejoins (``fedweave client``).
        tls: certificate files, or None with ``--insecure``.
        node_auth: only SuperNodes whose public key is registered may connect.
    """

    host: str
    port: int
    state_dir: Path
    tls: TlsFiles | None
    node_auth: bool = False

    @property
    def log_path(self) -> Path:
        return self.state_dir / "superlink.log"

    @property
    def local_address(self) -> str:
        """Where this machine reaches the SuperLink (loopback when it listens everywhere)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            *patched_flower("flower-superlink"),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--isolation",
            "subprocess",
            "--disable-runtime-dependency-installation",
        ]
        if self.tls is None:
            cmd.append("--insecure")
        else:
            cmd += [
                "--ssl-ca-certfile",
                str(self.tls.ca_cert),
                "--ssl-certfile",
                str(self.tls.server_cert),
                "--ssl-keyfile",
                str(self.tls.server_key),
            ]
        if self.node_auth:
            cmd.append("--enable-supernode-auth")
        return cmd


class ControlClient:
    """The few Control API calls the coordinator needs, with one-line errors."""

    def __init__(self, address: str, tls: TlsFiles | None) -> None:
        from fedweave.flower_patches.control_api import control_client

        root = tls.ca_cert.read_bytes() if tls is not None else None
        self._client = control_client(address, root)

    def close(self) -> None:
        self._client.close()

    def ready(self) -> bool:
        from fedweave.flower_patches.control_api import ListNodesRequest

        try:
            self._client.ListNodes(ListNodesRequest())
        except Exception:  # noqa: BLE001 - not up yet (refused, TLS handshake, 5xx)
            return False
        return True

    def nodes(self) -> list:
        from fedweave.flower_patches.control_api import ListNodesRequest

        return list(self._client.ListNodes(ListNodesRequest()).nodes_info)

    def online_nodes(self) -> list:
        return [n for n in self.nodes() if n.status == "online"]

    @staticmethod
    def flower_key(public_key_ssh: bytes) -> bytes:
        """A site key as written in ``DIR/sites/`` (OpenSSH) → as Flower stores it (PEM)."""
        from cryptography.hazmat.primitives import serialization

        from fedweave.flower_patches.control_api import flower_public_key

        return flower_public_key(serialization.load_ssh_public_key(public_key_ssh))

    def register(self, public_key_ssh: bytes, name: str) -> str:
        """Register a site key; returns ``registered`` or ``known`` (already there)."""
        from fedweave.flower_patches.control_api import RegisterNodeRequest

        key = self.flower_key(public_key_ssh)
        known = {bytes(n.public_key) for n in self.nodes()}
        if key in known:
            return "known"
        self._client.RegisterNode(RegisterNodeRequest(public_key=key, name=name[:40] or None))
        return "registered"

    def unregister(self, public_key_ssh: bytes) -> list[int]:
        """Remove every node holding this site key; returns their node ids. Flower then
        refuses the key's requests (its signature names no node) and forgets its node."""
        from fedweave.flower_patches.control_api import UnregisterNodeRequest

        key = self.flower_key(public_key_ssh)
        removed = []
        for node in self.nodes():
            if bytes(node.public_key) == key:
                self._client.UnregisterNode(UnregisterNodeRequest(node_id=node.node_id))
                removed.append(int(node.node_id))
        return removed

    def start_run(self, fab_bytes: bytes) -> int:
        from fedweave.flower_patches.control_api import start_run_request

        res = self._client.StartRun(start_run_request(fab_bytes))
        if not res.HasField("run_id"):
            raise UserError(f"the SuperLink refused the run: {res.note or 'no reason given'}")
        return int(res.run_id)

    def stop_run(self, run_id: int) -> bool:
        """Ask the SuperLink to stop a Flower run; whether it took the request."""
        from fedweave.flower_patches.control_api import StopRunRequest

        return bool(self._client.StopRun(StopRunRequest(run_id=run_id)).success)

    def run_status(self, run_id: int) -> tuple[str, str, str]:
        """(status, sub_status, details) of a Flower run."""
        from fedweave.flower_patches.control_api import ListRunsRequest

        runs = self._client.ListRuns(ListRunsRequest(run_id=run_id)).run_dict
        if run_id not in runs:
            return "unknown", "", ""
        status = runs[run_id].status
        return status.status, status.sub_status, status.details

    def save_logs(self, run_id: int, path: Path, timeout: float = 15.0) -> None:
        """Write the run's ServerApp log (kept by the SuperLink) to ``path``, best effort.

        The ServerApp's output goes to the SuperLink, not to our terminal; keeping it beside
        the SuperLink's own log is what an operator needs when a run fails.
        """
        import threading

        from fedweave.flower_patches.control_api import StreamLogsRequest

        chunks: list[str] = []

        def pull() -> None:
            try:
                for res in self._client.StreamLogs(
                    StreamLogsRequest(run_id=run_id, after_timestamp=0.0)
                ):
                    chunks.append(res.log_output)
            except Exception:  # noqa: BLE001 - the stream ends with an error on finished runs
                pass

        worker = threading.Thread(target=pull, daemon=True)
        worker.start()
        worker.join(timeout)
        try:
            write_private_text(path, "".join(chunks))
        except OSError:
            pass



def build_fab(run_config: dict) -> bytes:
    """A FAB naming our installed apps and carrying ``run_config``; no code inside (sites run
    the fedweave they installed, so code never travels over the network)."""
    import tomli_w

    from fedweave.flower_patches.control_api import bundle

    pyproject = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {"name": FAB_NAME, "version": "1.0.0", "dependencies": []},
        "tool": {
            "flwr": {
                "app": {
                    "publisher": FAB_PUBLISHER,
                    "components": {"serverapp": SERVER_APP_REF, "clientapp": CLIENT_APP_REF},
                    "config": run_config,
                }
            }
        },
    }
    files = {
        "pyproject.toml": tomli_w.dumps(pyproject).encode(),
        "README.md": b"fedweave deployment run: apps come from the installed fedweave package.\n",
    }
    return bundle(files)


def launch_superlink(options: SuperLinkOptions, env: dict[str, str]) -> subprocess.Popen:
    """Start the SuperLink's process without waiting for it (``await_superlink`` waits)."""
    options.state_dir.mkdir(parents=True, exist_ok=True)
    guarded = [sys.executable, "-m", "fedweave.procguard", "--", *options.command()]
    return spawn(guarded, options.log_path, env)


def await_superlink(options: SuperLinkOptions, proc: subprocess.Popen, timeout: float = 60.0):
    """Wait until the launched SuperLink's Control API answers; its client.

    A SuperLink that exits early (port taken in between, bad certificate, unreadable state
    database) becomes a one-line error with the last line of its log; one that does not
    answer within ``timeout`` seconds is stopped.
    """
    client = ControlClient(options.local_address, options.tls)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            client.close()
            raise UserError(
                f"the SuperLink stopped at start (exit {proc.returncode}): "
                f"{log_tail(options.log_path, needle='ERROR') or 'no log'}; "
                f"full log: {options.log_path}"
            )
        if client.ready():
            return client
        time.sleep(0.3)
    client.close()
    stop_process_group(proc)
    raise UserError(f"the SuperLink did not answer within {timeout:.0f} s; see {options.log_path}")
