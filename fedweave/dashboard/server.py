"""Serving a fedweave web app (the dashboard, a coordinator's ``/metrics``, a site's status)
with uvicorn: the socket is bound here first, so a port in use is one line, not a log."""

from __future__ import annotations

import socket
import threading

from starlette.types import ASGIApp

from fedweave.dashboard.security import Exposure
from fedweave.errors import UserError


def bind(exposure: Exposure, flag: str) -> socket.socket:
    """A listening socket at ``exposure``'s address, or a one-line error naming ``flag``."""
    family = socket.AF_INET6 if ":" in exposure.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((exposure.host, exposure.port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise UserError(
            f"{flag}: cannot listen on {exposure.host}:{exposure.port} "
            f"({exc.strerror or exc}); stop what uses it or pick another port"
        ) from None
    sock.set_inheritable(True)
    return sock


def _server(app: ASGIApp, exposure: Exposure):
    import uvicorn

    from fedweave.dashboard.slow_callers import GuardedH11Protocol

    config = uvicorn.Config(
        app,
        http=GuardedH11Protocol,  # a header deadline, a bound on callers still sending them
        log_level="warning",
        access_log=False,
        ssl_certfile=str(exposure.certfile) if exposure.certfile else None,
        ssl_keyfile=str(exposure.keyfile) if exposure.keyfile else None,
        timeout_keep_alive=5,
        limit_concurrency=256,  # past their headers: slow ones are cut (slow_callers.py)
        h11_max_incomplete_event_size=16 * 1024,
        lifespan="off",
    )
    return uvicorn.Server(config)


def serve_forever(app: ASGIApp, exposure: Exposure, sock: socket.socket) -> None:
    """Serve until Ctrl-C or SIGTERM (uvicorn's own handlers end it cleanly)."""
    _server(app, exposure).run(sockets=[sock])


class BackgroundServer:
    """A web app served from a daemon thread (the coordinator's ``--metrics-address``, the
    site's ``--status-address``), stopped by ``close``."""

    def __init__(self, app: ASGIApp, exposure: Exposure, sock: socket.socket) -> None:
        self._server = _server(app, exposure)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="fedweave-web", daemon=True
        )
        self._sock = sock
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()
