"""A round waits for its sites visibly and for a bounded time (``--wait-for-sites``).

Flower's client manager waits up to a day for ``--min-clients`` connected sites whenever a
round, its evaluation or a statistics stage samples them, silently. ``BoundedSites`` is the
run's client manager instead: while fewer sites are connected than a step needs it tells
the run's history (``SitesWait``: how many, since when, which of the run's sites are
missing), logs it, and after ``--wait-for-sites`` seconds raises ``SitesMissing``, which
ends the run interrupted and resumable. A site that joins meanwhile lets the round go on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from flwr.server import SimpleClientManager

from fedweave.history.records import SitesWait

log = logging.getLogger(__name__)

NOTE_EVERY_S = 5.0
"""Seconds between notes of a wait in the history (a count that changed is noted at once)."""


class SitesMissing(Exception):
    """Fewer sites than the run needs stayed connected for ``--wait-for-sites`` seconds."""


class BoundedSites(SimpleClientManager):
    """Flower's client manager whose waits for sites are bounded, noted and logged."""

    def __init__(
        self,
        bound_seconds: float,
        noted: Callable[[SitesWait | None], None] | None = None,
        registered: Callable[[], Mapping[str, str]] | None = None,
        note_every: float = NOTE_EVERY_S,
    ) -> None:
        """Args:
        bound_seconds: how long one wait may last before ``SitesMissing``.
        noted: told the wait while it lasts (about every ``note_every`` s and at each
            change), then ``None`` when the sites are back.
        registered: node id → the name its site key is registered under, to name the
            missing sites (None: node ids name them).
        """
        super().__init__()
        self.bound_seconds, self.note_every = bound_seconds, note_every
        self.noted, self.registered = noted, registered
        self._seen: dict[str, str] = {}  # node id → name, of every site connected in this run
        self._seen_lock = threading.Lock()

    def register(self, client: Any) -> bool:
        with self._seen_lock:
            self._seen[str(client.node_id)] = self._name(client)
        return super().register(client)

    def _name(self, client: Any) -> str:
        names = self.registered() if self.registered is not None else {}
        return names.get(str(client.node_id)) or str(client.node_id)

    def _missing(self) -> tuple[str, ...]:
        here = {self._name(client) for client in list(self.clients.values())}
        with self._seen_lock:
            seen = set(self._seen.values())
        return tuple(sorted(seen - here))

    def _tell(self, waiting: SitesWait | None) -> None:
        if self.noted is None:
            return
        try:
            self.noted(waiting)
        except Exception as exc:  # noqa: BLE001 - a note lost costs the view, never the run
            log.warning("the wait for sites was not noted: %s", exc)

    def wait_for(self, num_clients: int, timeout: int = 86400) -> bool:
        """Wait until ``num_clients`` sites are available, at most ``--wait-for-sites``
        seconds (Flower's ``timeout`` is its day-long default; a shorter one is kept).
        Raises ``SitesMissing`` when the bound passes."""
        if self.num_available() >= num_clients:
            return True
        bound = min(float(timeout), self.bound_seconds)
        started, since = time.monotonic(), datetime.now(timezone.utc)
        gives_up_at = since + timedelta(seconds=bound)
        said: tuple[int, tuple[str, ...]] | None = None
        last_note = 0.0
        while True:
            connected, missing = self.num_available(), self._missing()
            if connected >= num_clients:
                break
            left = bound - (time.monotonic() - started)
            if left <= 0:
                self._tell(None)
                gone = f" (missing: {', '.join(missing)})" if missing else ""
                raise SitesMissing(
                    f"waited {bound:g} s for sites: {connected} of {num_clients} connected"
                    f"{gone}; start them or lower --min-clients (--wait-for-sites sets this "
                    "wait)"
                )
            if (connected, missing) != said or time.monotonic() - last_note >= self.note_every:
                waiting = SitesWait(since, connected, num_clients, missing, gives_up_at)
                if (connected, missing) != said:
                    log.warning(waiting.line())
                self._tell(waiting)
                said, last_note = (connected, missing), time.monotonic()
            with self._cv:
                self._cv.wait_for(
                    lambda: self.num_available() >= num_clients, timeout=min(left, 1.0)
                )
        self._tell(None)
        log.warning("sites back: %d of %d connected; the run goes on", connected, num_clients)
        return True


class ConnectedNow:
    """A client manager seen by a round's evaluation: it samples among the sites connected
    now and never waits for more (a site lost during the round must not hold it open; the
    next round's sampling waits for ``--min-clients``)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def __getattr__(self, name: str) -> Any:
        return getattr(self.manager, name)

    def sample(
        self, num_clients: int, min_num_clients: int | None = None, criterion: Any | None = None
    ) -> list[Any]:
        available = self.manager.num_available()
        if available == 0:
            return []
        return self.manager.sample(min(num_clients, available), 1, criterion)
