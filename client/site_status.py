"""``fedweave client --status-address``: what this site contributed, from its own side.

The site's worker reports one record per message it answered (``client/mods.py``'s
``site_record``: trained, evaluated, sent statistics, or refused, rejected, failed with the
reason) and ``fedweave client`` notes its connection; ``SiteJournal`` keeps them (bounded)
and ``status_app`` serves them as a page and as JSON, read-only, on a loopback address only:
the view is for the site's own operators (from elsewhere: an ssh tunnel).
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from datetime import datetime, timezone
from typing import Any

from fedweave.contract import MAX_REASON_CHARS, bounded_site_metrics
from fedweave.errors import UserError

RECENT = 100
"""Records kept for the page (the newest), and problems kept apart from them."""
OUTCOMES = ("ok", "refused", "rejected", "late", "failed", "lost")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _numbers(metrics: Any) -> dict[str, float]:
    if not isinstance(metrics, dict):
        return {}
    return {k: v for k, v in bounded_site_metrics(metrics).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}  # fmt: skip


class SiteJournal:
    """This site's contributions and connection, as the status view shows them.

    Args:
        site: the site's name (``--name``).
        coordinator: the coordinator's ``HOST:PORT``.
        floor: the site's privacy floor (``require_secure_agg``, ``require_dp``,
            ``max_epsilon``), shown as it was given.
    """

    def __init__(
        self, site: str, coordinator: str, floor: dict[str, Any] | None = None
    ) -> None:
        self.site, self.coordinator = site, coordinator
        self.floor = dict(floor or {})
        self.started_at = _now()
        self.connection = {"state": "connecting", "since": self.started_at, "detail": None}
        self.totals: Counter = Counter()
        self.runs: dict[str, dict[str, Any]] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.problems: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self._lock = threading.Lock()

    def connected(self, state: str, detail: str | None = None) -> None:
        """The connection changed: ``connected``, ``lost``, ``refused``, ``connecting``."""
        with self._lock:
            if self.connection["state"] != state or self.connection["detail"] != detail:
                self.connection = {"state": state, "since": _now(), "detail": detail}

    def run_ended(self, run: int) -> None:
        with self._lock:
            self.runs.setdefault(str(run), self._new_run())["ended"] = True

    @staticmethod
    def _new_run() -> dict[str, Any]:
        return {"rounds_trained": 0, "evaluations": 0, "examples": None, "last_round": None,
                "training_metrics": {}, "evaluation_metrics": {}, "ended": False}  # fmt: skip

    def add(self, raw: dict[str, Any]) -> None:
        """One record from the worker (untrusted shape: every field is checked)."""
        outcome = raw.get("outcome") if raw.get("outcome") in OUTCOMES else "failed"
        record = {
            "at": _now(),
            "kind": str(raw.get("kind", ""))[:32],
            "part": str(raw.get("part") or raw.get("kind") or "")[:32],
            "run": None if _int(raw.get("run")) is None else str(raw["run"]),  # 64-bit: text
            "round": str(raw.get("round") or "")[:16] or None,
            "outcome": outcome,
            "examples": _int(raw.get("examples")),
            "masked": bool(raw.get("masked")),
            "metrics": _numbers(raw.get("metrics")),
            "reason": str(raw["reason"])[:MAX_REASON_CHARS] if raw.get("reason") else None,
        }
        with self._lock:
            self.recent.append(record)
            self.totals[f"{record['part']} {outcome}"] += 1
            if outcome != "ok":
                self.problems.append(record)
            if record["run"] is None:
                return
            run = self.runs.setdefault(record["run"], self._new_run())
            run["last_round"] = record["round"] or run["last_round"]
            if outcome == "ok" and record["part"] == "training":
                run["rounds_trained"] += 1
                run["examples"] = record["examples"]
                run["training_metrics"] = record["metrics"]
            elif outcome == "ok" and record["part"] == "evaluation":
                run["evaluations"] += 1
                run["evaluation_metrics"] = record["metrics"]

    def view(self) -> dict[str, Any]:
        with self._lock:
            return {
                "site": self.site,
                "coordinator": self.coordinator,
                "privacy_floor": dict(self.floor),
                "started_at": self.started_at,
                "server_time": _now(),
                "connection": dict(self.connection),
                "totals": dict(self.totals),
                "runs": [{"run": run, **values} for run, values in sorted(self.runs.items())],
                "problems": list(self.problems)[::-1],
                "recent": list(self.recent)[::-1],
            }


def status_app(journal: SiteJournal, hosts: frozenset[str] | None = None):
    """The site's status page (``/``) and its JSON (``/api/status``); GET only; ``hosts``:
    the ``Host:`` names it answers (``Guard``)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    from fedweave.dashboard.app import STATIC, Guard, json_response, page_response

    def page(request: Request) -> Response:
        return page_response(
            "status", f"site {journal.site}", journal.view(), nav=False, api="/api/status"
        )

    def api(request: Request) -> Response:
        return json_response(journal.view())

    app = Starlette(routes=[
        Route("/", page, methods=["GET"]),
        Route("/api/status", api, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ])  # fmt: skip
    return Guard(app, None, hosts)


def serve_status(address: str, journal: SiteJournal):
    """Check ``--status-address`` (loopback only), bind it and serve ``journal`` from a
    background thread; returns the server (``close()`` it)."""
    from fedweave.addresses import parse_host_port
    from fedweave.dashboard.security import Exposure, is_loopback
    from fedweave.dashboard.server import BackgroundServer, bind

    host, port = parse_host_port(address, "--status-address", "127.0.0.1:8081")
    if not is_loopback(host):
        raise UserError(
            f"--status-address {address}: give a loopback HOST:PORT (e.g. 127.0.0.1:8081); the "
            "site's own view is for its operators (reach it from elsewhere with ssh -L)"
        )
    serving = Exposure(host, port)
    sock = bind(serving, "--status-address")
    return serving, BackgroundServer(status_app(journal, serving.host_names), serving, sock)
