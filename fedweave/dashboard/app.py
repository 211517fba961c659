"""The dashboard's web app: pages, their JSON, ``/metrics``, read-only over the history.

Every page is a small HTML shell carrying its first data as JSON, drawn by ``static/app.js``
(charts by the vendored uPlot) and refreshed by short polls of the same JSON (``?after=N``:
only the rounds recorded since). Only GET and HEAD exist: nothing here can change a run.
A database that goes away mid-serve answers 503 with its one-line reason; the page says so
and keeps polling.
"""

from __future__ import annotations

import html
import json
import math
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from fedweave.dashboard.prometheus import CONTENT_TYPE, HistoryCollector, exposition
from fedweave.dashboard.security import (
    CONCURRENT_CHECKS,
    REALM,
    Credentials,
    FailedLogins,
    claimed_name,
    host_name,
)
from fedweave.dashboard.views import Views
from fedweave.history.store_errors import HistoryError
from fedweave.versions import described

POLL_MS = 2000
"""How often an open page asks for news (a run page: its new rounds and round in flight)."""
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
     b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]  # fmt: skip
_NAV = '<nav><a href="/">runs</a> <a href="/compare">compare</a></nav>'
STATIC = Path(str(resources.files("fedweave.dashboard") / "static"))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def json_response(value: Any, status: int = 200) -> Response:
    """``value`` as JSON (non-finite numbers as null), never cached."""
    body = json.dumps(_finite(value), separators=(",", ":"), allow_nan=False)
    return Response(body, status, media_type="application/json",
                    headers={"cache-control": "no-store"})  # fmt: skip


def page_response(
    kind: str,
    title: str,
    data: Any,
    status: int = 200,
    nav: bool = True,
    api: str | None = None,
    notice: str | None = None,
) -> HTMLResponse:
    """A page shell: its kind, its first data (JSON, never executed), the app's script and a
    footer naming the fedweave and Flower versions serving;
    ``nav``: the links to the runs and compare pages (the dashboard's, not a site's);
    ``api``: the JSON path with the same data, which a browser without JavaScript is told;
    ``notice``: a line the footer leads with (a certificate near its end)."""
    where = (
        f"The same data is JSON at <code>{html.escape(api)}</code>."
        if api
        else "Enable JavaScript to see it."
    )
    payload = json.dumps(_finite(data), separators=(",", ":"), allow_nan=False)
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return HTMLResponse(
        f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} · fedweave</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/static/style.css">
<link rel="stylesheet" href="/static/vendor/uPlot.min.css">
</head><body data-page="{kind}" data-poll-ms="{POLL_MS}">
<header><a class="brand" href="/">fedweave</a>{_NAV if nav else ""}<span id="status"
role="status"></span></header>
<main id="main"><h1>{html.escape(title)}</h1><p class="muted" id="loading">loading…</p>
<noscript><p>This page draws its tables and charts with JavaScript, which is off here.
{where}</p></noscript></main>
<footer class="muted">{_notice_html(notice)}{html.escape(described())}</footer>
<script id="initial" type="application/json">{payload}</script>
<script src="/static/vendor/uPlot.iife.min.js"></script>
<script src="/static/app.js"></script>
</body></html>""",
        status,
        headers={"cache-control": "no-store"},
    )


def _notice_html(notice: str | None) -> str:
    if not notice:
        return ""
    return f'<p class="alert" role="alert">{html.escape(notice)}</p>'


def certificate_notice(certificate: Path | None, now: datetime | None = None) -> str | None:
    """A line for the footer when the served certificate ends within
    ``certs.EXPIRY_WARNING_DAYS`` days (or has ended); None otherwise or without TLS."""
    from fedweave.certs import EXPIRY_WARNING_DAYS, certificate_end

    ends = certificate_end(certificate) if certificate is not None else None
    if ends is None:
        return None
    left = (ends - (now or datetime.now(timezone.utc))).total_seconds() / 86400
    if left >= EXPIRY_WARNING_DAYS:
        return None
    when = f"ended on {ends:%Y-%m-%d}" if left < 0 else (
        f"ends on {ends:%Y-%m-%d} (in {left:.0f} days)")  # fmt: skip
    return (
        f"the certificate {certificate.name} (the coordinator's, from --tls-dir) {when}: renew "
        f"it with `fedweave certs renew --dir {certificate.parent} --host NAME`"
    )


class Guard:
    """Security headers on every answer; with ``hosts`` (``Exposure.host_names``), 421 for a
    request whose ``Host:`` header names none of them; with credentials, 401 for a request
    without a valid one (nothing else is said to either)."""

    def __init__(
        self, app: ASGIApp, credentials: Credentials | None, hosts: frozenset[str] | None = None
    ) -> None:
        self.app, self.credentials, self.hosts = app, credentials, hosts
        self.failed_logins = FailedLogins()
        self._checks = None  # the CapacityLimiter of the scrypt checks, made on first use

    async def _refused_for(self, authorization: str | None, scope: Scope) -> float | None:
        """None when ``authorization`` is a valid credential; else the seconds its source (or
        name) must still wait before a check (0: it was checked, and failed)."""
        if self.credentials.remembers(authorization):
            return None
        if not authorization:
            return 0.0  # a browser's first request: it asks for the credential now
        source = (scope.get("client") or (None,))[0]
        name = claimed_name(authorization)
        wait = self.failed_logins.wait(source, name)
        if wait > 0:
            return wait
        if self._checks is None:
            self._checks = anyio.CapacityLimiter(CONCURRENT_CHECKS)
        if await anyio.to_thread.run_sync(
            self.credentials.allows, authorization, limiter=self._checks
        ):
            self.failed_logins.succeeded(source, name)
            return None
        self.failed_logins.failed(source, name)
        return 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        headers = dict(scope.get("headers") or [])
        if self.hosts is not None:
            named = host_name(headers.get(b"host", b"").decode("latin-1"))
            if named not in self.hosts:
                response = Response("421 misdirected request: unknown Host\n", 421,
                                    media_type="text/plain")  # fmt: skip
                await response(scope, receive, with_headers)
                return
        if self.credentials is not None:
            authorization = headers.get(b"authorization", b"").decode("latin-1") or None
            wait = await self._refused_for(authorization, scope)
            if wait:
                response = Response("429 too many failed logins\n", 429, media_type="text/plain",
                                    headers={"retry-after": str(math.ceil(wait))})  # fmt: skip
                await response(scope, receive, with_headers)
                return
            if wait is not None:
                response = Response(
                    "401 unauthorized\n", 401, media_type="text/plain",
                    headers={"www-authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
                )  # fmt: skip
                await response(scope, receive, with_headers)
                return
        await self.app(scope, receive, with_headers)


def make_app(
    views: Views,
    credentials: Credentials | None = None,
    *,
    pages: bool = True,
    collector: HistoryCollector | None = None,
    hosts: frozenset[str] | None = None,
    certificate: Path | None = None,
) -> ASGIApp:
    """The dashboard (``pages``) and ``/metrics`` over ``views``; ``collector`` defaults to
    every running and recent run. ``pages=False`` serves ``/metrics`` only (the coordinator's
    ``--metrics-address``). ``hosts``: the ``Host:`` names it answers (``Guard``).
    ``certificate``: the ``server.pem`` it serves with, whose end every page's footer warns
    of from ``certs.EXPIRY_WARNING_DAYS`` days before (``fedweave_certificate_days_left``)."""
    from fedweave.certs import certificate_end

    collector = collector or HistoryCollector(
        views,
        certificate_ends=(lambda: certificate_end(certificate)) if certificate else None,
    )

    def page(*args: Any, **kwargs: Any) -> HTMLResponse:
        return page_response(*args, notice=certificate_notice(certificate), **kwargs)

    def not_found(what: str) -> HTMLResponse:
        return page("missing", "not found", {"message": what}, 404)

    def after_of(request: Request) -> int:
        try:
            return max(0, int(request.query_params.get("after", "0")))
        except ValueError:
            return 0

    def runs_page(request: Request) -> Response:
        return page("runs", "runs", runs_view(), api="/api/runs")

    def runs_api(request: Request) -> Response:
        return json_response(runs_view())

    def runs_view() -> dict[str, Any]:
        """Every run, the operators' studies and each site's current jobs."""
        return {"runs": views.runs(), "studies": views.studies(), "sites": views.site_jobs()}

    def run_page(request: Request) -> Response:
        """The shell only (it paints at once, however long the run); the page then asks
        ``/api/runs/ID`` for the run, which a first visit reads from the database."""
        run_id = request.path_params["run_id"]
        try:
            found = views.run_info(run_id)
        except KeyError:
            return not_found(f"no run '{run_id}' in this history; the runs list shows them all")
        return page(
            "run", f"run {found.run_id}", {"run_id": found.run_id},
            api=f"/api/runs/{found.run_id}",
        )  # fmt: skip

    def run_api(request: Request) -> Response:
        try:
            return json_response(views.run(request.path_params["run_id"], after_of(request)))
        except KeyError:
            return json_response({"error": "no such run"}, 404)

    def site_page(request: Request) -> Response:
        run_id, site = request.path_params["run_id"], request.path_params["site"]
        try:
            data = views.site(run_id, site)
        except KeyError:
            return not_found(f"no site '{site}' in run '{run_id}' of this history")
        return page("site", f"site {site}", data, api=f"/api{request.url.path}")

    def site_api(request: Request) -> Response:
        try:
            params = request.path_params
            return json_response(views.site(params["run_id"], params["site"]))
        except KeyError:
            return json_response({"error": "no such run or site"}, 404)

    def compare_data(request: Request) -> dict[str, Any]:
        chosen = [r for r in request.query_params.getlist("run") if r][:8]
        data = views.compare(chosen) if chosen else {"runs": [], "metric_names": []}
        data["choices"] = [
            {k: run[k] for k in ("run_id", "mode", "task", "status", "strategy", "started_at")}
            for run in views.runs()
        ]
        return data

    def compare_page(request: Request) -> Response:
        try:
            api = "/api/compare" + (f"?{request.url.query}" if request.url.query else "")
            return page("compare", "compare runs", compare_data(request), api=api)
        except KeyError as exc:
            return not_found(f"no run '{exc.args[0]}' in this history to compare")

    def compare_api(request: Request) -> Response:
        try:
            return json_response(compare_data(request))
        except KeyError:
            return json_response({"error": "no such run"}, 404)

    def metrics(request: Request) -> Response:
        return Response(exposition(collector), media_type=CONTENT_TYPE,
                        headers={"cache-control": "no-store"})  # fmt: skip

    def unavailable(request: Request, exc: Exception) -> Response:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if request.url.path.startswith("/api/") or request.url.path == "/metrics":
            return json_response({"error": reason}, 503)
        return page("missing", "history unavailable", {"message": reason}, 503)

    def missing(request: Request, exc: Exception) -> Response:
        if request.url.path.startswith("/api/"):
            return json_response({"error": "not found"}, 404)
        return not_found(f"nothing at {request.url.path} here; the runs list is at /")

    routes = [Route("/metrics", metrics, methods=["GET"])]
    if pages:
        routes += [
            Route("/", runs_page, methods=["GET"]),
            Route("/runs/{run_id}", run_page, methods=["GET"]),
            Route("/runs/{run_id}/sites/{site:path}", site_page, methods=["GET"]),
            Route("/compare", compare_page, methods=["GET"]),
            Route("/api/runs", runs_api, methods=["GET"]),
            Route("/api/runs/{run_id}", run_api, methods=["GET"]),
            Route("/api/runs/{run_id}/sites/{site:path}", site_api, methods=["GET"]),
            Route("/api/compare", compare_api, methods=["GET"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    app = Starlette(
        routes=routes,
        exception_handlers={HistoryError: unavailable, 404: missing},
        middleware=[Middleware(GZipMiddleware, minimum_size=1024)],
    )
    return Guard(app, credentials, hosts)
