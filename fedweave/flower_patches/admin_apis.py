"""The SuperLink's Control and Runtime APIs answer this machine only (applied in the
coordinator's SuperLink process by ``fedweave.flower_patches.launch``).

Flower 1.41 serves its Fleet API (sites), Control API (starting runs, registering nodes) and
Runtime API (SuperExec, ``flwr-serverapp``) as one HTTPS app on ``--host/--port``. Whoever
holds the CA certificate, which every site does, could therefore ``StartRun`` an app bundle
of their own (its code then ran at every site and in ``flwr-serverapp``), ``RegisterNode``
their own key past site authentication, or ``AcquireTask`` the ServerApp's task. Without
an account plugin (Flower's is enterprise-only) nothing in 1.41 authenticates these callers.

This patch puts one ASGI middleware in front of Flower's (``flwr.superlink.main
._get_middleware``): a request to ``/v1/control/``, ``/v1/runtime/`` or the API docs is
answered 403 unless it comes from this machine. "This machine" is what the connection says,
not a header: the peer address is loopback, or it equals the address the connection reached
(Linux gives a connection from a host to its own address that address as source; this is how
the SuperExec and ``flwr-serverapp``, which Flower points at ``--host``, reach the API).
The coordinator itself calls from loopback. Fleet requests (sites) pass unchanged.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

log = logging.getLogger("fedweave.flower_patches")

ADMIN_PATH_PREFIXES = ("/v1/control/", "/v1/runtime/", "/docs", "/openapi.json", "/redoc")
"""Paths only this machine may call: everything that is not the Fleet API or a health check."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def is_local_caller(client: str | None, server: str | None) -> bool:
    """Whether a connection from ``client`` to ``server`` (host addresses) starts on this
    machine: a loopback peer, or a peer whose address is the one it connected to."""
    if not client:
        return False
    try:
        peer = ipaddress.ip_address(client.split("%", 1)[0])
    except ValueError:
        return False  # a Unix socket or a name: never how fedweave's SuperLink is reached
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped
    return peer.is_loopback or (server is not None and client == server)


def is_admin_path(path: str) -> bool:
    return path.startswith(ADMIN_PATH_PREFIXES)


MAX_LOGGED_CALLERS = 1000
"""Caller addresses remembered for logging each once; past that, refusals go unlogged (the
403 stands): an outsider must not grow this process's memory or log."""


class LocalAdminOnly:
    """ASGI middleware: administrative paths answer 403 to callers on other machines."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        self._logged: set[str | None] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_admin_path(scope.get("path", "")):
            client = (scope.get("client") or (None, None))[0]
            server = (scope.get("server") or (None, None))[0]
            if not is_local_caller(client, server):
                await self._refuse(scope, send, client)
                return
        await self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, send: Send, client: str | None) -> None:
        if client not in self._logged and len(self._logged) < MAX_LOGGED_CALLERS:
            self._logged.add(client)  # one line per caller
            log.warning("refused %s from %s: administrative APIs answer this machine only",
                        scope.get("path", ""), client)  # fmt: skip
        body = json.dumps(
            {"detail": "administrative API: this SuperLink answers its own machine only"}
        ).encode()
        await send({
            "type": "http.response.start", "status": 403,
            "headers": [(b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
        })  # fmt: skip
        await send({"type": "http.response.body", "body": body})


def install() -> None:
    import flwr.superlink.main as superlink_main
    from starlette.middleware import Middleware

    stock = superlink_main._get_middleware
    if getattr(stock, "fedweave_patch", False):
        return

    def _get_middleware() -> list[Middleware]:
        return [Middleware(LocalAdminOnly), *stock()]  # outermost: before Flower parses a byte

    _get_middleware.fedweave_patch = True  # type: ignore[attr-defined]
    superlink_main._get_middleware = _get_middleware
