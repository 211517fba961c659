"""``fedweave.coordinator.deployed_app:server_app``: the ServerApp the coordinator's Flower
App Bundle names. Flower's ``flwr-serverapp`` imports it from the installed package and calls
it with the run's config; all settings come from there (``deployed_run.DeployPlan``).
"""

from __future__ import annotations

from flwr.common import Context
from flwr.server import Grid, ServerApp

from fedweave.coordinator.deployed_run import DeployPlan, run_plan
from fedweave.flower_patches import tune_deployed_polling

server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """Run (or continue) the planned run against the SuperLink's connected sites."""
    tune_deployed_polling()
    run_plan(DeployPlan.from_run_config(dict(context.run_config)), grid, context)
