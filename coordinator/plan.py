"""The plan: what ``fedweave coordinator`` (``command/``) hands the ServerApp Flower starts
for the run (``serverapp/``), the one thing those two processes share, as
``fedweave/contract.py`` is between the coordinator and its sites.

The coordinator creates or resumes the history run and writes the plan into the Flower App
Bundle's run config (``DeployPlan.to_run_config``); Flower's ``flwr-serverapp`` reads it back
(``DeployPlan.from_run_config``). What only this deployment knows (the history's database
URL, the coordinator's process id) never travels in the run config (the SuperLink stores and
shows run configs) nor in any environment (every Flower process would inherit the password):
the coordinator writes it to a 0600 file in a 0700 folder (``write_deployment_file``) and the
plan carries only that file's path (``read_deployment_file`` on the ServerApp's side).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedweave.config import SETTINGS, RunConfig
from fedweave.config.run_config import coerce
from fedweave.contract import RUN_ID_KEY as RUN_CONFIG_ID_KEY
from fedweave.contract import RUN_OPERATOR_KEY, RUN_VERSIONS_KEY

DEPLOYMENT_FILE_KEY = "fw-deployment-file"
"""Run config: the path of the coordinator's 0600 deployment file (``write_deployment_file``)."""


@dataclass(frozen=True)
class Deployment:
    """What the ServerApp learns from the coordinator that started it, out of the run config.

    Attributes:
        db_url: the history database URL (may hold a password).
        coordinator_pid: the ``fedweave coordinator`` process the ServerApp must not outlive.
        bulk_spool: the folder shared with the coordinator's transfer server (``--bulk-address``;
            ``fedweave/bulk/spool.py``), or ``None``: tensors go through Flower.
        bulk_port: that server's port.
    """

    db_url: str
    coordinator_pid: int
    bulk_spool: str | None = None
    bulk_port: int | None = None


def write_deployment_file(folder: Path, deployment: Deployment) -> Path:
    """Write ``deployment`` as JSON to ``folder/deployment.json`` readable by this user only;
    returns the path. The file is created 0600 in one step (no moment where it is readable by
    others), in a folder made 0700."""
    import dataclasses
    import json

    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.chmod(0o700)
    path = folder / "deployment.json"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(dataclasses.asdict(deployment), out)
    return path


SITE_NAMES_FILE = "site-names.json"
"""Beside the deployment file: Flower node id → the name its site key is registered under
(``DIR/site-keys/NAME.pub``), rewritten by the coordinator whenever it registers or revokes a
key, read by the ServerApp as each round closes (``registered_site_names``): a site is
recorded under the name its key holds, whatever name its replies claim."""
MAX_SITE_NAMES_BYTES = 4 << 20
"""The most of ``SITE_NAMES_FILE`` the ServerApp reads (~50,000 sites)."""


def write_site_names(folder: Path, names: dict[str, str]) -> Path:
    """Write ``names`` (node id → registered name) to ``folder/SITE_NAMES_FILE``, 0600, in
    one step: a reader sees the old file or the new one, never half of one."""
    import json

    from fedweave.private_files import write_private_text

    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / SITE_NAMES_FILE
    partial = folder / f".{SITE_NAMES_FILE}.{os.getpid()}"
    partial.unlink(missing_ok=True)  # created anew, so 0600 whatever was there
    write_private_text(partial, json.dumps(names))
    os.replace(partial, path)
    return path


def registered_site_names(deployment_file: Path | None) -> Callable[[], dict[str, str]] | None:
    """A reader of the coordinator's ``SITE_NAMES_FILE`` beside ``deployment_file`` (None
    without one: a simulation, or a run config written by hand). Each call returns the
    current node id → name map, read again only when the file changed; a missing, oversized
    or unreadable file reads as no registered names (sites keep the names they give)."""
    if deployment_file is None:
        return None
    import json

    path = deployment_file.parent / SITE_NAMES_FILE
    seen: list = [None, {}]  # (mtime, size), names

    def names() -> dict[str, str]:
        try:
            stat = path.stat()
            if (stat.st_mtime_ns, stat.st_size) == seen[0]:
                return seen[1]
            if stat.st_size > MAX_SITE_NAMES_BYTES:
                raise ValueError("too large")
            data = json.loads(path.read_text(encoding="utf-8"))
            read = {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}
        seen[:] = [(stat.st_mtime_ns, stat.st_size), read]
        return read

    return names


def read_deployment_file(path: Path) -> Deployment:
    """The ``Deployment`` the coordinator wrote to ``path``."""
    import json

    data = json.loads(path.read_text(encoding="utf-8"))
    spool, port = data.get("bulk_spool"), data.get("bulk_port")
    return Deployment(
        str(data["db_url"]), int(data["coordinator_pid"]),
        str(spool) if spool else None, int(port) if port else None,
    )  # fmt: skip


PLAN_SETTINGS = (
    "task", "test_data", "label_column", "rounds", "local_epochs", "optimizer", "lr",
    "weight_decay", "clip_grad_norm", "batch_size", "seed", "initial_model", "peft",
    "lora_rank", "lora_alpha", "lora_targets", "device", "sites",
    "min_clients", "clients_per_round", "strategy", "proximal_mu", "max_update_norm", "compress",
    "downlink", "round_timeout", "min_replies", "schedule", "buffer", "max_staleness", "server_lr",
    "fraction_evaluate", "evaluate_every", "cross_site", "private_evaluation", "select_metric",
    "select_mode", "run",
    "secure_agg", "secagg_timeout", "dp", "noise_multiplier", "clipping_norm", "dp_epsilon",
    "dp_delta", "target_epsilon", "max_epsilon", "checkpoint_dir", "track", "wait_for_sites",
    "max_clock_skew", "db_outage",
)  # fmt: skip
"""The settings the ServerApp runs with; the rest (address, TLS, database) stay with the CLI."""


@dataclass(frozen=True)
class DeployPlan:
    """What the ServerApp needs: the history run to record into and the run's settings.

    Attributes:
        run_id: the history run to record into.
        config: the run's settings; paths are absolute on the coordinator's machine.
        deployment_file: the coordinator's deployment file (``write_deployment_file``);
            ``None`` until the coordinator has written it.
        operator: who submitted the run (``fedweave run submit``); ``None`` for the
            coordinator's command-line run. Sites see it (``RUN_OPERATOR_KEY``).
    """

    run_id: str
    config: RunConfig
    deployment_file: Path | None = None
    operator: str | None = None

    def to_run_config(self) -> dict[str, Any]:
        """Flower run-config keys: ``fw-run-id``, the coordinator's versions (``fw-versions``)
        plus each plan setting with ``-`` for ``_`` (unset optional settings are left out: run
        configs hold no nulls)."""
        from fedweave.versions import described

        out: dict[str, Any] = {RUN_CONFIG_ID_KEY: self.run_id, RUN_VERSIONS_KEY: described()}
        if self.deployment_file is not None:
            out[DEPLOYMENT_FILE_KEY] = str(self.deployment_file)
        if self.operator is not None:
            out[RUN_OPERATOR_KEY] = self.operator
        for name in PLAN_SETTINGS:
            value = self.config.value(name)
            if value is not None:
                out[name.replace("_", "-")] = str(value) if isinstance(value, Path) else value
        return out

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> DeployPlan:
        if RUN_CONFIG_ID_KEY not in run_config:
            raise ValueError(
                "run config has no fw-run-id: this run was not started by `fedweave coordinator`"
            )
        values = {}
        for name in PLAN_SETTINGS:
            key = name.replace("_", "-")
            if key in run_config:
                values[name] = coerce(SETTINGS[name], run_config[key], f"run config {key}")
        deployment_file = run_config.get(DEPLOYMENT_FILE_KEY)
        return cls(
            str(run_config[RUN_CONFIG_ID_KEY]),
            RunConfig().replace(**values),
            Path(str(deployment_file)) if deployment_file else None,
            str(run_config[RUN_OPERATOR_KEY]) if RUN_OPERATOR_KEY in run_config else None,
        )
