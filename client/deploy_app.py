"""The ClientApp a deployed site runs: ``client.deploy_app:app`` (named in the coordinator's
Flower App Bundle; the SuperNode's ``flwr-clientapp`` imports it from the installed package).

Settings come from Flower, not from Python arguments, because Flower builds this object:

- the run config (set by the coordinator): ``task`` (the run's task);
- the node config (set by ``fedweave client`` on the site): ``data-path`` (the site's own
  file, the only data it trains on), ``task`` (what the operator says this site holds),
  ``label-column`` (CSV), ``device`` (``cpu``/``cuda``; empty: auto).

A site whose task differs from the run's, or whose data does not fit the run's model, answers
with an error naming the reason; the coordinator records it as a failed site and the round
carries on with the others.
"""

from __future__ import annotations

from flwr.client import ClientApp
from flwr.common import Context

from client.mods import SITE_MODS

REFUSED_PREFIX = "fedweave-refused"
"""Starts the error text of a site that refuses a run (wrong task or data shape)."""


class SiteRefused(RuntimeError):
    """This site cannot take part in this run; the message says why and what to change."""


def _config_str(config: dict, key: str) -> str | None:
    value = config.get(key)
    return str(value) if value not in (None, "") else None


def site_client(context: Context):
    """Build this site's client for the run in ``context`` (or refuse with the reason).

    Torch and the task are imported here, not at module level: Flower starts a fresh
    ``flwr-clientapp`` process per message, and three of SecAgg+'s four stages per round
    never reach the client, so they skip the ~1.5 s torch import.
    """
    from client.flower_app import TaskClient, _cached_data, _cached_task
    from client.training import TrainConfig

    run_task = _config_str(context.run_config, "task")
    site_task = _config_str(context.node_config, "task")
    data_path = _config_str(context.node_config, "data-path")
    if run_task is None:
        raise SiteRefused(f"{REFUSED_PREFIX}: the run does not name a task")
    if site_task is not None and site_task != run_task:
        raise SiteRefused(
            f"{REFUSED_PREFIX}: site holds task '{site_task}' but the run trains '{run_task}'; "
            f"restart the site with --task {run_task} and matching data"
        )
    if data_path is None:
        raise SiteRefused(f"{REFUSED_PREFIX}: the site has no data file (fedweave client --data)")
    try:
        data = _cached_data(data_path, run_task, _config_str(context.node_config, "label-column"))
    except Exception as exc:  # a UserError from the reader: wrong shape, classes, file
        raise SiteRefused(f"{REFUSED_PREFIX}: {str(exc).splitlines()[0]}") from None
    config = TrainConfig(device=_config_str(context.node_config, "device"))
    return TaskClient(
        _cached_task(run_task), data, config, site_index=context.node_id % 1_000_003
    ).to_client()


app = ClientApp(client_fn=site_client, mods=SITE_MODS)
