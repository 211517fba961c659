"""A run that names its sites (``--sites``, a study's ``[federation] sites``) samples only them.

``NamedSites`` is the run's Flower client manager: every connected node is registered as
Flower registers them, but the strategy, SecAgg+, federated evaluation and the statistics
stage see only the nodes whose site key is registered under one of the names (the
coordinator's ``plan.SITE_NAMES_FILE``, read as it changes). A node whose key has no name
yet, or another name, is never sampled, whatever name it claims in its replies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fedweave.coordinator.rounds.site_wait import BoundedSites


class _NamedOnly:
    """Flower's sampling criterion (``select``): a node whose key is registered under one of
    the run's names, and the caller's own criterion, if any."""

    def __init__(self, allowed: Callable[[Any], bool], criterion: Any | None) -> None:
        self.allowed, self.criterion = allowed, criterion

    def select(self, client: Any) -> bool:
        if not self.allowed(client):
            return False
        return self.criterion is None or bool(self.criterion.select(client))


class NamedSites(BoundedSites):
    """The run's client manager (``site_wait.BoundedSites``), showing only the sites a run
    names: its waits count only them."""

    def __init__(
        self, names: frozenset[str], registered: Callable[[], Mapping[str, str]], **bounded: Any
    ) -> None:
        """Args:
        names: the site names the run takes part with.
        registered: node id → the name its site key is registered under (read on each call).
        bounded: ``BoundedSites``'s bound and note.
        """
        super().__init__(registered=registered, **bounded)
        self.names = names

    def _allowed(self, client: Any) -> bool:
        return self.registered().get(str(client.node_id)) in self.names

    def _missing(self) -> tuple[str, ...]:
        here = {self._name(client) for client in self.all().values()}
        return tuple(sorted(self.names - here))

    def num_available(self) -> int:
        return sum(1 for client in self.clients.values() if self._allowed(client))

    def all(self) -> dict[str, Any]:
        return {cid: client for cid, client in self.clients.items() if self._allowed(client)}

    def sample(
        self, num_clients: int, min_num_clients: int | None = None, criterion: Any | None = None
    ) -> list[Any]:
        return super().sample(num_clients, min_num_clients, _NamedOnly(self._allowed, criterion))
