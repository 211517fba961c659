"""One deployed federated run: its plan (what Flower's run config carries) and the ServerApp
that records every round in the SQL history (``server_app``, which the coordinator's Flower
App Bundle names: Flower's ``flwr-serverapp`` imports it from the installed package).

Two processes share this module. ``fedweave coordinator`` (the CLI) creates or resumes the
history run and writes the plan into the Flower App Bundle's run config; Flower's
``flwr-serverapp`` (started by the SuperLink) reads the plan back, continues after the last
recorded round and records the rest. What only this deployment knows (the history's database
URL, the coordinator's process id) never travels in the run config (the SuperLink stores and
shows run configs) nor in any environment (every Flower process would inherit the password):
the coordinator writes it to a 0600 file in a 0700 folder (``write_deployment_file``) and the
plan carries only that file's path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.common import Context
from flwr.server import Grid, ServerApp

from fedweave.config import SETTINGS, RunConfig
from fedweave.config.run_config import coerce
from fedweave.contract import RUN_ID_KEY as RUN_CONFIG_ID_KEY

DEPLOYMENT_FILE_KEY = "fw-deployment-file"
"""Run config: the path of the coordinator's 0600 deployment file (``write_deployment_file``)."""


@dataclass(frozen=True)
class Deployment:
    """What the ServerApp learns from the coordinator that started it, out of the run config.

    Attributes:
        db_url: the history database URL (may hold a password).
        coordinator_pid: the ``fedweave coordinator`` process the ServerApp must not outlive.
    """

    db_url: str
    coordinator_pid: int


def write_deployment_file(folder: Path, deployment: Deployment) -> Path:
    """Write ``deployment`` as JSON to ``folder/deployment.json`` readable by this user only;
    returns the path. The file is created 0600 in one step (no moment where it is readable by
    others), in a folder made 0700."""
    import json

    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.chmod(0o700)
    path = folder / "deployment.json"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump({"db_url": deployment.db_url, "coordinator_pid": deployment.coordinator_pid}, out)
    return path


def read_deployment_file(path: Path) -> Deployment:
    """The ``Deployment`` the coordinator wrote to ``path``."""
    import json

    data = json.loads(path.read_text(encoding="utf-8"))
    return Deployment(str(data["db_url"]), int(data["coordinator_pid"]))


PLAN_SETTINGS = (
    "task", "test_data", "label_column", "rounds", "local_epochs", "optimizer", "lr",
    "weight_decay", "clip_grad_norm", "batch_size", "seed", "device",
    "min_clients", "clients_per_round", "strategy", "proximal_mu", "max_update_norm", "compress",
    "round_timeout", "min_replies", "schedule", "buffer", "max_staleness", "server_lr",
    "fraction_evaluate", "evaluate_every", "cross_site", "private_evaluation", "select_metric",
    "select_mode", "run",
    "secure_agg", "secagg_timeout", "dp", "noise_multiplier", "clipping_norm", "dp_epsilon",
    "dp_delta", "checkpoint_dir", "track",
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
    """

    run_id: str
    config: RunConfig
    deployment_file: Path | None = None

    def to_run_config(self) -> dict[str, Any]:
        """Flower run-config keys: ``fw-run-id`` plus each plan setting with ``-`` for ``_``
        (unset optional settings are left out: run configs hold no nulls)."""
        out: dict[str, Any] = {RUN_CONFIG_ID_KEY: self.run_id}
        if self.deployment_file is not None:
            out[DEPLOYMENT_FILE_KEY] = str(self.deployment_file)
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
        )


def test_data_of(config: RunConfig):
    """The coordinator's held-out data, or ``None`` (``central_test_data``)."""
    from fedweave.learning.data import central_test_data
    from fedweave.learning.tasks import load_task

    return central_test_data(
        load_task(config.data.task), config.data.test_data, config.data.label_column
    )


def exit_with_coordinator(pid: int, poll_s: float = 0.2) -> None:
    """Leave at once when the coordinator process is gone (even by kill -9).

    Flower's own chain (SuperLink → SuperExec → flwr-serverapp) takes several seconds to
    notice and then retries a dead SuperLink; meanwhile a restarted coordinator may already
    be resuming the run. Every recorded round is on disk and in the database (atomically),
    so a hard exit loses at most the round in flight, which the resume redoes. ``pid`` is
    the coordinator's (0: none to watch).
    """
    import threading

    from fedweave.history.liveness import pid_alive

    if pid <= 0:
        return

    def watch() -> None:
        while pid_alive(pid):
            time.sleep(poll_s)
        os._exit(70)

    threading.Thread(target=watch, name="coordinator-watch", daemon=True).start()


@contextmanager
def recording_run(plan: DeployPlan) -> Iterator[Any]:
    """The history store this ServerApp records ``plan``'s run into (the process leaves with
    the coordinator's: ``exit_with_coordinator``). The run is marked completed when the body
    ends, failed with the first line of its error when it raises (a stop signal is the CLI's
    to record, as interrupted); the store is closed either way. Without a deployment file (a
    run config written by hand) the history is the default one."""
    from fedweave.history import open_store

    deployment = (
        read_deployment_file(plan.deployment_file) if plan.deployment_file is not None else None
    )
    exit_with_coordinator(deployment.coordinator_pid if deployment else 0)
    store = open_store(deployment.db_url if deployment else None)
    try:
        yield store
        store.finish_run(plan.run_id, "completed")
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        store.finish_run(plan.run_id, "failed", reason)
        raise
    finally:
        store.close()


def run_plan(plan: DeployPlan, grid, context) -> None:
    """The ServerApp body: continue ``plan.run_id`` after its last recorded round.

    Rounds are recorded (checkpoint first, then the round's rows) by the same recorder the
    simulation uses, and mirrored to MLflow or TensorBoard with ``--track``; the CLI watches
    the history to print progress. A failure marks the run failed with its reason;
    completion marks it completed (``recording_run``).
    """
    from fedweave.coordinator.history_recorder import (
        BackgroundRecorder,
        HistoryRecorder,
        resume_point,  # torch: only once a run starts
    )
    from fedweave.coordinator.server_app import ServerSettings, initial_weights, make_server_app
    from fedweave.history.metrics import recorded_statistics
    from fedweave.history.tracking import make_tracker

    if plan.config.evaluation.run:  # `fedweave evaluate`: an evaluation-only run
        from fedweave.coordinator.evaluation_run import run_evaluation

        run_evaluation(plan, grid, context)
        return
    with recording_run(plan) as store:
        config = plan.config
        weights, offset = resume_point(store, plan.run_id)
        remaining = config.training.rounds - offset
        if remaining <= 0:
            return
        settings = ServerSettings(
            config=config,
            min_clients=config.federation.min_clients,
            rounds=remaining,
            round_offset=offset,
        )
        start = (
            weights
            if weights is not None
            else initial_weights(config.data.task, config.training.seed)
        )
        # `fedweave coordinator` checked the package is there (check_tracker); files land
        # relative to its directory, which Flower's processes inherit
        tracker = make_tracker(config.history.track, plan.run_id, store.get_run(plan.run_id).config)
        recorder = BackgroundRecorder(
            HistoryRecorder(store, plan.run_id, config.history.checkpoint_dir, tracker=tracker)
        )
        try:
            statistics = recorded_statistics(store.rounds(plan.run_id)) if offset else None
            app = make_server_app(
                settings, test_data_of(config), start, [recorder], statistics, [recorder]
            )
            app(grid=grid, context=context)
            recorder.flush()
        finally:
            recorder.close()  # writes what is pending, to the tracker too
            if tracker is not None:
                tracker.close()


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """Run (or continue) the planned run against the SuperLink's connected sites."""
    from fedweave.flower_patches import tune_deployed_polling

    tune_deployed_polling()
    run_plan(DeployPlan.from_run_config(dict(context.run_config)), grid, context)
