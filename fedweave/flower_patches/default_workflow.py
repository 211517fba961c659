"""What the coordinator's rounds take from Flower's ``DefaultWorkflow`` and legacy strategy
path that Flower does not export (not a patch: used as they are).

- ``MAIN_CONFIGS_RECORD``, ``MAIN_PARAMS_RECORD``, ``Key``
  (``flwr.server.workflow.constant``): the records in which ``DefaultWorkflow`` keeps the
  round number and the global model in the context; the coordinator's own fit and evaluate
  workflows (``federated_statistics.py``, ``federated_evaluation.py``,
  ``private_evaluation.py``, ``secure_buffer.py``) read and write them as Flower's do;
- ``default_fit_workflow``: ``coordinator/rounds/deadlines.py`` hands it a grid that bounds
  its wait;
- ``ClientProxy`` (the type of a site in every ``Strategy`` method) and ``GridClientProxy``
  (``secure_buffer.py`` builds the proxies a strategy is handed, as ``DefaultWorkflow`` does).

All fingerprinted (``fingerprints``, entry ``default_workflow``); this module refuses to be
imported on Flower code that differs (``rely_on``).
"""

from __future__ import annotations

from fedweave.flower_patches import rely_on

rely_on("default_workflow")

from flwr.server.client_proxy import ClientProxy  # noqa: E402
from flwr.server.compat.grid_client_proxy import GridClientProxy  # noqa: E402
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key  # noqa: E402
from flwr.server.workflow.default_workflows import default_fit_workflow  # noqa: E402

__all__ = [
    "MAIN_CONFIGS_RECORD",
    "MAIN_PARAMS_RECORD",
    "ClientProxy",
    "GridClientProxy",
    "Key",
    "default_fit_workflow",
]
