"""One deployed federated run: its plan (what Flower's run config carries), where it resumes
from, and the ServerApp body that records every round in the SQL history.

Two processes share this module. ``fedweave coordinator`` (the CLI) creates or resumes the
history run and writes the plan into the Flower App Bundle's run config; Flower's
``flwr-serverapp`` (started by the SuperLink) reads the plan back, continues after the last
recorded round and records the rest. The history's database URL never travels in the run
config (the SuperLink stores and shows run configs): it reaches the ServerApp through the
environment the SuperLink inherits (``FEDWEAVE_DEPLOY_DB``).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from fedweave.contract import RUN_ID_KEY as RUN_CONFIG_ID_KEY
from fedweave.errors import UserError

COORDINATOR_PID_ENV = "FEDWEAVE_COORDINATOR_PID"
"""The ``fedweave coordinator`` process the ServerApp must not outlive (set by the coordinator)."""

DB_ENV = "FEDWEAVE_DEPLOY_DB"
"""Environment variable the ServerApp reads the history URL from (set by the coordinator)."""



@dataclass(frozen=True)
class DeployPlan:
    """Everything the ServerApp needs, as TOML-safe values (Flower's run config types).

    Attributes:
        run_id: the history run to record into.
        task: task name or ``module:attr``.
        rounds: total rounds of the run (a resumed run does the remaining ones).
        min_clients: connected sites needed before a round starts.
        clients_per_round: sites sampled per round (0: all ``min_clients``).
        local_epochs / lr / batch_size / seed: local training, as in simulation.
        secure_agg: SecAgg+ on (default True).
        checkpoint_dir: where per-round model files go (absolute path on the coordinator).
        test_data: held-out file for central evaluation ("": the task's own test split).
    """

    run_id: str
    task: str
    rounds: int
    min_clients: int
    clients_per_round: int = 0
    local_epochs: int = 1
    lr: float = 0.1
    batch_size: int = 16
    seed: int = 0
    secure_agg: bool = True
    checkpoint_dir: str = "checkpoints"
    test_data: str = ""

    def to_run_config(self) -> dict[str, Any]:
        """Run-config keys: ``fw-run-id`` plus the other fields with ``-`` for ``_``."""
        values = asdict(self)
        out: dict[str, Any] = {RUN_CONFIG_ID_KEY: values.pop("run_id")}
        out.update({k.replace("_", "-"): v for k, v in values.items()})
        return out

    @classmethod
    def from_run_config(cls, config: dict[str, Any]) -> DeployPlan:
        if RUN_CONFIG_ID_KEY not in config:
            raise ValueError(
                "run config has no fw-run-id: this run was not started by `fedweave coordinator`"
            )
        kwargs: dict[str, Any] = {"run_id": str(config[RUN_CONFIG_ID_KEY])}
        for f in fields(cls):
            key = f.name.replace("_", "-")
            if f.name != "run_id" and key in config:
                kwargs[f.name] = config[key]
        return cls(**kwargs)

    def history_config(self) -> dict[str, Any]:
        """What the history stores as the run's config (compared on ``--resume``)."""
        values = asdict(self)
        for name in ("run_id", "checkpoint_dir"):
            values.pop(name)
        values["mode"] = "deployment"
        return values


IDENTITY_KEYS = (
    "task",
    "rounds",
    "min_clients",
    "clients_per_round",
    "local_epochs",
    "lr",
    "batch_size",
    "seed",
    "secure_agg",
)
"""Settings a resumed run must keep: they decide what the run computes."""


def check_resumable(run, plan: DeployPlan, explicit: set[str]) -> DeployPlan:
    """The plan to continue ``run`` with: its stored settings, refusing contradicting flags."""
    if run.status == "completed":
        raise UserError(
            f"run {run.run_id} already completed {run.rounds_completed} rounds; nothing to resume"
        )
    stored = run.config or {}
    if stored.get("mode") != "deployment":
        raise UserError(
            f"run {run.run_id} is not a deployment run; resume it with `fedweave simulate --resume`"
        )
    conflicts = [
        f"--{name.replace('_', '-')} {getattr(plan, name)} (run has {stored.get(name)})"
        for name in IDENTITY_KEYS
        if name in explicit and name in stored and stored[name] != getattr(plan, name)
    ]
    if conflicts:
        raise UserError(
            f"cannot resume run {run.run_id} with a different config: {'; '.join(conflicts)}; "
            "drop those flags to continue it as it was"
        )
    kept = {name: stored[name] for name in IDENTITY_KEYS if name in stored}
    values = {**asdict(plan), **kept, "run_id": run.run_id}
    return DeployPlan(**values)


def _test_data(plan: DeployPlan):
    from fedweave.learning.data import load_site_data
    from fedweave.learning.task import load_task

    task = load_task(plan.task)
    if plan.test_data:
        return load_site_data(plan.test_data, task)
    return task.load_data()[1]


def exit_with_coordinator(poll_s: float = 0.2) -> None:
    """Leave at once when the coordinator process is gone (even by kill -9).

    Flower's own chain (SuperLink → SuperExec → flwr-serverapp) takes several seconds to
    notice and then retries a dead SuperLink; meanwhile a restarted coordinator may already
    be resuming the run. Every recorded round is on disk and in the database (atomically),
    so a hard exit loses at most the round in flight, which the resume redoes.
    """
    import threading

    from fedweave.history.liveness import pid_alive

    pid = int(os.environ.get(COORDINATOR_PID_ENV, "0") or 0)
    if pid <= 0:
        return

    def watch() -> None:
        while pid_alive(pid):
            time.sleep(poll_s)
        os._exit(70)

    threading.Thread(target=watch, name="coordinator-watch", daemon=True).start()


def run_plan(plan: DeployPlan, grid, context) -> None:
    """The ServerApp body: continue ``plan.run_id`` after its last recorded round.

    Rounds are recorded (checkpoint first, then the round's rows) by the same recorder the
    simulation uses; the CLI watches the history to print progress. A failure marks the run
    failed with its reason; completion marks it completed.
    """
    from fedweave.coordinator.history_recorder import BackgroundRecorder, HistoryRecorder
    from fedweave.coordinator.server_app import ServerSettings, initial_weights, make_server_app
    from fedweave.history import open_store

    exit_with_coordinator()
    store = open_store(os.environ.get(DB_ENV) or None)
    recorder = None
    try:
        from fedweave.coordinator.history_recorder import (
            resume_point,  # torch: only once a run starts
        )

        weights, offset = resume_point(store, plan.run_id)
        remaining = plan.rounds - offset
        if remaining > 0:
            settings = ServerSettings(
                task=plan.task,
                rounds=remaining,
                min_clients=plan.min_clients,
                clients_per_round=plan.clients_per_round or None,
                local_epochs=plan.local_epochs,
                lr=plan.lr,
                batch_size=plan.batch_size,
                seed=plan.seed,
                round_offset=offset,
                secure_agg=plan.secure_agg,
            )
            start = weights if weights is not None else initial_weights(plan.task, plan.seed)
            recorder = BackgroundRecorder(
                HistoryRecorder(store, plan.run_id, Path(plan.checkpoint_dir))
            )
            app = make_server_app(settings, _test_data(plan), start, [recorder])
            app(grid=grid, context=context)
            recorder.flush()
        store.finish_run(plan.run_id, "completed")
    except Exception as exc:  # a stop signal is the CLI's to record (as interrupted)
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        store.finish_run(plan.run_id, "failed", reason)
        raise
    finally:
        if recorder is not None:
            recorder.close()
        store.close()
