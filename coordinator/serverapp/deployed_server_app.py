"""The ServerApp a deployment runs, ``server_app`` (``contract.SERVER_APP_REF`` names it in the
coordinator's Flower App Bundle; Flower's ``flwr-serverapp`` process, started by the
SuperLink, imports it from the installed package), as ``client/deployed_app.py`` is the
site's ClientApp.

It reads the plan ``fedweave coordinator`` wrote into the run config (``coordinator/plan.py``),
continues the history run after its last recorded round and records the rest through the
round loop of ``coordinator/rounds/``; an evaluation-only run (``fedweave evaluate``) goes to
``evaluation_app.py`` instead. Only this process runs this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flwr.common import Context
from flwr.server import Grid, ServerApp

from fedweave.coordinator.plan import DeployPlan, read_deployment_file, registered_site_names

if TYPE_CHECKING:
    from fedweave.coordinator.rounds.round_app import GridWrapper
from fedweave.coordinator.serverapp.history_run import recording_run


def run_plan(plan: DeployPlan, grid, context) -> None:
    """The ServerApp body: continue ``plan.run_id`` after its last recorded round.

    Rounds are recorded (checkpoint first, then the round's rows) by the same recorder the
    simulation uses, and mirrored to MLflow or TensorBoard with ``--track``; the CLI watches
    the history to print progress. A failure marks the run failed with its reason;
    completion marks it completed (``recording_run``).
    """
    from fedweave.coordinator.rounds.history_listener import (
        BackgroundRecorder,
        HistoryRecorder,
        resume_point,  # torch: only once a run starts
    )
    from fedweave.coordinator.rounds.round_app import initial_weights, make_server_app
    from fedweave.coordinator.rounds.round_settings import ServerSettings, test_data_of
    from fedweave.coordinator.rounds.site_wait import SitesMissing
    from fedweave.errors import UserError
    from fedweave.history.metrics import nothing_learned, recorded_privacy, recorded_statistics
    from fedweave.history.tracking import make_tracker

    if plan.config.evaluation.run:  # `fedweave evaluate`: an evaluation-only run
        from fedweave.coordinator.serverapp.evaluation_app import run_evaluation

        run_evaluation(plan, grid, context)
        return
    with recording_run(plan) as recording:
        store, config = recording.store, plan.config
        weights, offset = resume_point(store, plan.run_id)
        remaining = config.training.rounds - offset
        if remaining <= 0:
            return
        settings = ServerSettings(
            config=config,
            min_clients=config.federation.min_clients,
            rounds=remaining,
            round_offset=offset,
            run_id=plan.run_id,
        )
        start = (
            weights
            if weights is not None
            else initial_weights(
                config,
                (store.get_run(plan.run_id).config or {}).get("initial_model", {}).get("sha256"),
            )
        )
        # `fedweave coordinator` checked the package is there (check_tracker); files land
        # relative to its directory, which Flower's processes inherit
        tracker = make_tracker(config.history.track, plan.run_id, store.get_run(plan.run_id).config)
        recorder = BackgroundRecorder(
            HistoryRecorder(store, plan.run_id, config.history.checkpoint_dir,
                            config.history.db_outage, tracker)  # fmt: skip
        )
        try:
            recorded = store.rounds(plan.run_id) if offset else []
            app = make_server_app(
                settings, test_data_of(config), start, [recorder],
                recorded_statistics(recorded) if offset else None, [recorder],
                registered_names=registered_site_names(plan.deployment_file),
                privacy=recorded_privacy(recorded, config.privacy.dp),
                ended_early=recording.ended_early.append,
                wire=direct_transfers(plan),
                sites_wait=lambda waiting: store.note_sites_wait(plan.run_id, waiting),
            )  # fmt: skip
            del start, weights  # the app holds the start until round 1 is made of it
            try:
                app(grid=grid, context=context)
            except SitesMissing as missing:
                recorder.flush()
                recording.interrupted.append(str(missing))
                return
            recorder.flush()
            done = store.rounds(plan.run_id)
            first = store.site_results(plan.run_id, done[0]["round"]) if done else None
            problem = nothing_learned(done, plan.run_id, first)
            if problem is not None:
                raise UserError(problem)
        finally:
            recorder.close()  # writes what is pending, to the tracker too
            if tracker is not None:
                tracker.close()


def direct_transfers(plan: DeployPlan) -> GridWrapper | None:
    """The grid wrapper of a coordinator started with ``--bulk-address`` (its deployment file
    names the spool and the port): ``wrap(grid, spooled=None)``, ``spooled`` being where the
    plain rounds' updates wait on disk; or ``None``: tensors go through Flower."""
    if plan.deployment_file is None:
        return None
    deployment = read_deployment_file(plan.deployment_file)
    if deployment.bulk_spool is None or deployment.bulk_port is None:
        return None
    from pathlib import Path

    from fedweave.bulk.spool import Spool
    from fedweave.coordinator.rounds.bulk import BulkGrid

    spool, port = Spool(Path(deployment.bulk_spool)), deployment.bulk_port
    return lambda grid, spooled=None: BulkGrid(grid, spool, port, spooled)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """Run (or continue) the planned run against the SuperLink's connected sites."""
    from fedweave.flower_patches import tune_deployed_polling

    tune_deployed_polling()
    run_plan(DeployPlan.from_run_config(dict(context.run_config)), grid, context)
