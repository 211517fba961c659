"""Sites recorded by name, not by Flower's node id (which changes when a site reconnects).

Each site sends its name with its fit metrics (``SITE_NAME_METRIC``: ``fedweave client
--name``, or a simulated site's file name). ``SiteNames`` wraps the round listeners: it learns
node id → name from the replies and records every site of a round under its name (its node
id stays in the site's metrics), including the failed and late ones it has heard from before.
Two live sites giving one name are told apart by node id and reported in the round's warnings.

Deployed with site keys, a name is bound to the key: ``registered`` (the coordinator's
``plan.SITE_NAMES_FILE``) gives node id → the name the site's key is registered under, and a
registered site is recorded under that name whatever its replies claim; a different claim is
one warning per node (a registered insider cannot pass itself off as another site).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fedweave.contract import SITE_NAME_METRIC, SITE_NAME_PATTERN


class SiteNames:
    """Round listeners that see site names instead of node ids."""

    def __init__(
        self,
        listeners: Sequence[Any],
        registered: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        """Args:
        listeners: the round listeners that see sites by name.
        registered: node id → the name its site key is registered under, read as each
            round closes (None, the default: no registered names; sites are recorded
            under the names they give).
        """
        self.listeners = list(listeners)
        self.registered = registered
        self.names: dict[str, str] = {}
        self.noted: set[str] = set()  # nodes already warned of for claiming another name

    def on_round(self, summary: Any) -> None:
        evaluations = [
            *getattr(summary, "evaluations", ()), *getattr(summary, "cross_site", ())
        ]  # fmt: skip
        registered = self.registered() if self.registered is not None else {}
        unnamed: set[str] = set()
        for site in [*summary.sites, *evaluations]:
            name = site.metrics.get(SITE_NAME_METRIC)
            bound = registered.get(site.site_id)
            if bound is not None:
                self.names[site.site_id] = bound
                if name is not None and name != bound and site.site_id not in self.noted:
                    self.noted.add(site.site_id)
                    claim = (
                        f"the name '{name}'"
                        if isinstance(name, str) and SITE_NAME_PATTERN.match(name)
                        else "a name that is not one"
                    )
                    summary.warnings = [
                        *summary.warnings,
                        f"site {bound} (node {site.site_id}) sent {claim}; recorded under "
                        "the name its key is registered with",
                    ]
            elif isinstance(name, str) and SITE_NAME_PATTERN.match(name):
                self.names[site.site_id] = name
            elif name is not None and site.site_id not in unnamed:
                unnamed.add(site.site_id)
                summary.warnings = [
                    *summary.warnings,
                    f"site {site.site_id} sent a name that is not one (1-64 letters, digits, "
                    "'.', '_' or '-'); recorded by its node id",
                ]
        claimed: dict[str, list[str]] = {}
        for site in summary.sites:
            name = self.names.get(site.site_id)
            if name is not None:
                claimed.setdefault(name, []).append(site.site_id)
        for name, nodes in claimed.items():
            if len(nodes) > 1:
                summary.warnings = [
                    *summary.warnings,
                    f"{len(nodes)} sites call themselves '{name}' (nodes {', '.join(nodes)}); "
                    "give each its own: fedweave client --name",
                ]
        for site in evaluations:  # a site sampled to evaluate only: its name, if it gave one
            name = self.names.get(site.site_id)
            if name is not None and name not in claimed:
                claimed[name] = [site.site_id]
        for site in [*summary.sites, *evaluations]:
            name = self.names.get(site.site_id)
            if name is None:
                continue
            node = site.site_id
            site.metrics = {
                **{k: v for k, v in site.metrics.items() if k != SITE_NAME_METRIC},
                "node_id": node,
            }
            # a name its key is registered under stays that site's, whoever else claims it
            own = len(claimed[name]) == 1 or registered.get(node) == name
            site.site_id = name if own else f"{name} (node {node})"
        for site in getattr(summary, "cross_site", ()):  # whose model it scored
            owner = site.metrics.get("model")
            if owner in self.names:
                site.metrics = {**site.metrics, "model": self.names[owner]}
        for listener in self.listeners:
            listener.on_round(summary)
