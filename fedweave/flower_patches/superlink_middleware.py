"""The SuperLink's HTTP middleware runs only where it acts (applied in the coordinator's
SuperLink process by ``fedweave.flower_patches.launch``; a speed-up).

Flower's SuperLink passes every request through eight Starlette middlewares
(``flwr.superlink.main._get_middleware``; nine in 1.41, whose tracing layer 1.42 removed),
each a ``BaseHTTPMiddleware``: a layer costs a task group, a pair of memory streams and a
re-wrapped response per request, even when its ``dispatch`` only calls the next layer. Five
of the eight act on Control API requests only, or only when an event-log plugin is
configured; a site's Fleet request (a round's message is ~16 of them) paid for all of them.
Skipping them (six, on 1.41) took a plain 8-round 3-site run's SuperLink from 20.7 to 13.4
CPU seconds and its rounds from 3.18 to 2.54 s (median; docs/testing.md).

This patch wraps each of those five in ``UnlessInert``: a request for which the layer's
``dispatch`` would only ``call_next`` and return the response unchanged (``INERT``: the
condition read from its dispatch, class by class, fingerprinted) goes straight to the next
layer; every other request goes through the layer as before. The error translator, the
protobuf translation and site authentication (``NodeAuthMiddleware``) stay on every request
they serve. Nothing else changes: the same handlers, the same responses, the same errors.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CONTROL_PREFIX = "/v1/control/"
FLEET_PREFIX = "/v1/fleet/"


def _not_control(scope: Scope) -> bool:
    return not scope["path"].startswith(CONTROL_PREFIX)


def _not_sensitive(scope: Scope) -> bool:
    from flwr.superlink.routers.control.middlewares import CONTROL_SENSITIVE_ROUTE_KEYS

    return (scope["method"], scope["path"]) not in CONTROL_SENSITIVE_ROUTE_KEYS


def _no_fleet_log(scope: Scope) -> bool:
    if not scope["path"].startswith(FLEET_PREFIX):
        return True
    app = scope.get("app")
    return app is not None and getattr(app.state, "fleet_event_log_plugin", None) is None


_CONTROL = "flwr.superlink.routers.control.middlewares"

INERT: dict[str, Callable[[Scope], bool]] = {
    f"{_CONTROL}:ControlSensitiveResponseMiddleware": _not_sensitive,
    f"{_CONTROL}:ControlAuthenticationMiddleware": _not_control,
    f"{_CONTROL}:ControlLicenseMiddleware": _not_control,
    f"{_CONTROL}:ControlEventLogMiddleware": _not_control,
    "flwr.superlink.routers.fleet.middlewares:FleetEventLogMiddleware": _no_fleet_log,
}
"""Flower middleware class (``module:Class``, each fingerprinted) → whether a request (its
ASGI scope) is one its ``dispatch`` passes through untouched."""


class UnlessInert:
    """ASGI middleware: ``middleware`` for the requests it acts on, the next layer directly
    for those ``inert`` says it would pass through untouched."""

    def __init__(
        self, app: ASGIApp, *, middleware: tuple[Any, tuple, dict], inert: Callable[[Scope], bool]
    ) -> None:
        cls, args, kwargs = middleware
        self.app = app
        self.layer = cls(app, *args, **kwargs)
        self.inert = inert

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path") and self.inert(scope):
            await self.app(scope, receive, send)
        else:
            await self.layer(scope, receive, send)


def _resolve(ref: str) -> type:
    import importlib

    module_name, _, name = ref.partition(":")
    return getattr(importlib.import_module(module_name), name)


def install() -> None:
    """Wrap the six layers in ``UnlessInert`` wherever ``_get_middleware`` lists them (the
    version guard is the caller's; the list around them, the security layer included, is
    kept as it is)."""
    import flwr.superlink.main as superlink_main
    from starlette.middleware import Middleware

    inert_for = {_resolve(ref): inert for ref, inert in INERT.items()}
    listed = superlink_main._get_middleware

    def _get_middleware() -> list[Middleware]:
        return [
            Middleware(UnlessInert, middleware=tuple(entry), inert=inert_for[entry.cls])
            if entry.cls in inert_for else entry
            for entry in listed()
        ]  # fmt: skip

    _get_middleware.__wrapped__ = listed  # type: ignore[attr-defined]
    _get_middleware.fedweave_patch = True  # type: ignore[attr-defined]
    superlink_main._get_middleware = _get_middleware
