"""The history run a ServerApp records into, in Flower's ``flwr-serverapp`` process: opened
from the coordinator's deployment file, finished as completed or failed with the body, and
never outliving the ``fedweave coordinator`` process that planned it. Both ServerApp bodies
(the training run of ``deployed_server_app.py``, the evaluation-only run of
``evaluation_app.py``) record through it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fedweave.coordinator.plan import DeployPlan, read_deployment_file


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


@dataclass
class Recording:
    """What a ServerApp body records into: ``store``, and ``ended_early``, where the body
    says why the run ended before its last round (``--max-epsilon``), the completed run's
    reason; ``interrupted``, why it stopped short and may be resumed (``--wait-for-sites``),
    the interrupted run's reason."""

    store: Any
    ended_early: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)


@contextmanager
def recording_run(plan: DeployPlan) -> Iterator[Recording]:
    """The history this ServerApp records ``plan``'s run into (the process leaves with the
    coordinator's: ``exit_with_coordinator``). The run is marked completed when the body
    ends (with the reason it ``ended_early`` for, if any), failed with the first line of its
    error when it raises, unless the coordinator ended it first (a stop signal or an
    operator's stop is the CLI's to record, as interrupted); the store
    is closed either way. Without a deployment file (a run config written by hand) the
    history is the default one."""
    from fedweave.history import open_store

    deployment = (
        read_deployment_file(plan.deployment_file) if plan.deployment_file is not None else None
    )
    exit_with_coordinator(deployment.coordinator_pid if deployment else 0)
    store = open_store(deployment.db_url if deployment else None)
    recording = Recording(store)
    try:
        yield recording
        early, interrupted = recording.ended_early, recording.interrupted
        outage = plan.config.history.db_outage
        if interrupted:
            store.finish_run(plan.run_id, "interrupted", interrupted[0], outage)
        else:
            store.finish_run(plan.run_id, "completed", early[0] if early else None, outage)
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        # a run the coordinator ended first (an operator's stop, which makes Flower's grid
        # raise here) keeps the end it recorded
        store.finish_run(plan.run_id, "failed", reason, only_if_running=True)
        raise
    finally:
        store.close()
