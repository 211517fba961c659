"""The ClientApp a deployed site runs: ``fedweave.client.deployed_app:app`` (named in the
coordinator's Flower App Bundle; the SuperNode's ``flwr-clientapp`` imports it from the
installed package).

Settings come from Flower, not from Python arguments, because Flower builds this object:

- the run config (set by the coordinator): ``task`` (the run's task);
- the node config (set by ``fedweave client`` on the site): ``data-path`` (the site's own
  file, the only data it trains on), ``task`` (what the operator says this site holds),
  ``more-tasks`` (its other tasks, each with its own file, its DP ledger and personal
  layers beside that file), ``policy`` (its policy file, ``client/mods.site_policy_guard``),
  ``label-column`` (CSV), ``device`` (``cpu``/``cuda``; empty: auto), ``eval-data-path``
  (the site's own evaluation file) or ``eval-fraction`` (the share of its data it holds out
  to evaluate the global model on), ``personal-state`` (the folder it keeps a task's local
  layers in), ``nproc-per-node`` (the processes its local training runs in).

A site whose task differs from the run's, or whose data does not fit the run's model, answers
with an error naming the reason; the coordinator records it as a failed site and the round
carries on with the others.
"""

from __future__ import annotations

from typing import Any

from flwr.client import ClientApp
from flwr.common import Context

from fedweave.client.mods import site_mods
from fedweave.client.worker import parse_more_tasks
from fedweave.contract import (
    NODE_BASE_MODEL_KEY,
    NODE_COLUMNS_KEY,
    NODE_DATA_PATH_KEY,
    NODE_DEVICE_KEY,
    NODE_EVAL_DATA_KEY,
    NODE_EVAL_FRACTION_KEY,
    NODE_LABEL_COLUMN_KEY,
    NODE_MAX_DELTA_KEY,
    NODE_MAX_EPSILON_KEY,
    NODE_MORE_TASKS_KEY,
    NODE_NPROC_KEY,
    NODE_PERSONAL_STATE_KEY,
    NODE_PRIVACY_LEDGER_KEY,
    NODE_SITE_NAME_KEY,
    NODE_TASK_KEY,
    RUN_TASK_KEY,
    SiteRefusal,
)


def _config_str(config: dict, key: str) -> str | None:
    value = config.get(key)
    return str(value) if value not in (None, "") else None


def site_client(context: Context):
    """Build this site's client for the run in ``context`` (or refuse with the reason).

    Torch and the task are imported here, not at module level: Flower starts a fresh
    ``flwr-clientapp`` process per message, and three of SecAgg+'s four stages per round
    never reach the client, so they skip the ~1.5 s torch import.
    """
    from fedweave.client.site_app import TaskClient, cached_site_parts, cached_task
    from fedweave.learning.site_processes import SiteData
    from fedweave.learning.training import TrainConfig

    run_task = _config_str(context.run_config, RUN_TASK_KEY)
    site_task = _config_str(context.node_config, NODE_TASK_KEY)
    data_path = _config_str(context.node_config, NODE_DATA_PATH_KEY)
    if run_task is None:
        raise SiteRefusal("the run does not name a task")
    more = parse_more_tasks(_config_str(context.node_config, NODE_MORE_TASKS_KEY))
    primary = site_task is None or site_task == run_task
    if not primary and run_task not in more:
        held = ", ".join(f"'{task}'" for task in [site_task, *more])
        raise SiteRefusal(
            f"site holds task{'s' * bool(more)} {held} but the run trains '{run_task}'; "
            f"restart the site with --more-tasks {run_task}=DATA to serve it"
        )
    if not primary:  # one of --more-tasks: its own file, the task's own columns
        data_path = more[run_task]
    if data_path is None:
        raise SiteRefusal("the site has no data file (fedweave client --data)")
    node = context.node_config if primary else {}
    site_data = SiteData(
        run_task, data_path, _config_str(node, NODE_LABEL_COLUMN_KEY),
        _config_str(node, NODE_COLUMNS_KEY), _config_str(node, NODE_EVAL_DATA_KEY),
        float(_config_str(context.node_config, NODE_EVAL_FRACTION_KEY) or 0.1),
    )  # fmt: skip
    try:
        data, evaluation = cached_site_parts(
            data_path, run_task, site_data.label_column, site_data.eval_path,
            site_data.eval_fraction, site_data.columns,
        )  # fmt: skip
    except Exception as exc:  # a UserError from the reader: wrong shape, classes, file
        raise SiteRefusal(str(exc).splitlines()[0]) from None
    config = TrainConfig.for_task(
        cached_task(run_task), device=_config_str(context.node_config, NODE_DEVICE_KEY)
    )
    return TaskClient(
        cached_task(run_task),
        data,
        config,
        site_index=context.node_id % 1_000_003,
        node_id=context.node_id,
        site_name=_config_str(context.node_config, NODE_SITE_NAME_KEY),
        evaluation=evaluation,
        ledger_path=_config_str(context.node_config, NODE_PRIVACY_LEDGER_KEY) if primary
        else f"{data_path}.privacy-ledger.json",  # a ledger is its data's
        max_epsilon=_max_epsilon(context),
        max_delta=_max_delta(context),
        base_model=_config_str(context.node_config, NODE_BASE_MODEL_KEY),
        layers_dir=_config_str(context.node_config, NODE_PERSONAL_STATE_KEY) if primary
        else f"{data_path}.personal",
        processes=_processes(context, site_data),
    ).to_client()


def _processes(context: Context, data: Any) -> Any:
    """How this site trains across processes (``--nproc-per-node``) on ``data`` (its
    ``SiteData``), or ``None`` for one process."""
    nproc = int(_config_str(context.node_config, NODE_NPROC_KEY) or 1)
    if nproc <= 1:
        return None
    from fedweave.learning.site_processes import SiteProcesses

    return SiteProcesses(nproc, data, _config_str(context.node_config, NODE_DEVICE_KEY))


def _max_delta(context: Context) -> float | None:
    """The site's ``--max-delta`` cap (its node config), or ``None``: its default."""
    value = _config_str(context.node_config, NODE_MAX_DELTA_KEY)
    return float(value) if value is not None else None


def _max_epsilon(context: Context) -> float | None:
    """The site's ``--max-epsilon`` floor (its node config), or ``None``."""
    value = _config_str(context.node_config, NODE_MAX_EPSILON_KEY)
    return float(value) if value is not None else None


app = ClientApp(client_fn=site_client, mods=site_mods())
