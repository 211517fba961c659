"""The coordinator's transfer server (``fedweave coordinator --bulk-address``): sites fetch the
model and upload their updates here, over HTTPS, beside Flower's messages.

Two requests, each authorised by the token of one message (``Authorization: Bearer``), which
Flower delivered to one site over its authenticated channel (``spool.py``):

- ``GET /v1/blobs/DIGEST``: a blob the grant names;
- ``PUT /v1/uploads``: the site's reply tensors, once per grant, at most the grant's limit;
  answered with ``{"upload": ID, "digest": SHA256, "size": N}``.

Anyone else (no token, a wrong or expired one, the CA certificate alone) gets 403 and nothing
else. A grant of a site whose key the coordinator has since revoked allows nothing
(``node_allowed``: the coordinator's registered node ids), so revocation takes hold here as it
does in Flower. Every read has a deadline (``IO_TIMEOUT_S`` per read, the grant's expiry for the
whole request, ``HELLO_DEADLINE_S`` from a connection's arrival to its headers) and a size limit;
at most ``MAX_CONNECTIONS`` are served at once, one request each (a new one evicts the oldest
still sending its headers, so slow callers cannot keep a site out), and a grant fetches a blob
at most ``MAX_FETCHES`` times.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from fedweave.bulk.spool import Grant, Spool

log = logging.getLogger("fedweave.bulk")

IO_TIMEOUT_S = 30.0
"""Seconds one read or write of a connection may wait (the TLS handshake included)."""
HELLO_DEADLINE_S = 10.0
"""Seconds from a connection's arrival to the end of its request's headers (the TLS handshake
included): a peer trickling bytes cannot hold one of the ``MAX_CONNECTIONS`` longer."""
MAX_FETCHES = 3
"""Times one grant may fetch one blob (a site fetches it once; a retry or two)."""
MAX_CONNECTIONS = 64
"""Connections served at once; one more evicts the oldest still without its headers (of the
address holding most of those), or is closed at once where none is waiting."""
EVICT_WAIT_S = 1.0
"""Seconds a new connection waits for the slot an eviction frees."""
CHUNK = 1 << 20
SWEEP_EVERY_S = 30.0


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class _Handler(BaseHTTPRequestHandler):
    server: BulkServer
    protocol_version = "HTTP/1.1"
    server_version = "fedweave-bulk"
    sys_version = ""

    def handle(self) -> None:
        """One request a connection: the deadline to its headers holds for every request."""
        self.close_connection = True
        self.handle_one_request()

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        timer = self.server.hellos.pop(self.connection, None)
        if timer is not None:
            timer.cancel()
        self.server.headers_in(self.connection)
        return parsed

    def log_message(self, format: str, *args) -> None:  # type: ignore[no-untyped-def]  # noqa: A002
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(self._get)

    def do_PUT(self) -> None:  # noqa: N802
        self._answer(self._put)

    def handle_expect_100(self) -> bool:
        """An upload is checked before its body is asked for (``Expect: 100-continue``): a
        refused one is answered while the site still listens, and never sent."""
        if self.command == "PUT":
            try:
                self._upload_grant = self._checked_upload()
            except _Refused as refused:
                self._refuse(refused)
                return False
        return super().handle_expect_100()

    def _answer(self, handle: Callable[[], None]) -> None:
        try:
            handle()
        except _Refused as refused:
            self._refuse(refused)
        except (OSError, ssl.SSLError) as exc:  # the peer went away or was too slow
            self.close_connection = True
            log.debug("transfer from %s ended: %s", self.address_string(), exc)

    def _refuse(self, refused: _Refused) -> None:
        self.server.counts.count("refused", 0)
        body = json.dumps({"error": refused.reason}).encode()
        self.close_connection = True
        try:
            self.send_response(refused.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass

    def _grant(self) -> Grant:
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or len(auth) > 200:
            raise _Refused(403, "no transfer token")
        grant = self.server.spool.grant_of(auth[len("Bearer ") :].strip())
        if grant is None:
            raise _Refused(403, "unknown or expired transfer token")
        if not self.server.node_allowed(grant.node):
            raise _Refused(403, "this site's key is no longer registered")
        return grant

    def _get(self) -> None:
        prefix = "/v1/blobs/"
        if not self.path.startswith(prefix):
            raise _Refused(404, "no such resource")
        grant = self._grant()
        name = self.path[len(prefix) :]
        if name not in grant.fetch:
            raise _Refused(403, "the token does not allow this blob")
        if not self.server.counts.fetch_allowed(grant.id, name):
            raise _Refused(429, f"this token has fetched this blob {MAX_FETCHES} times")
        try:
            file = open(self.server.spool.blob_path(name), "rb")  # noqa: SIM115
        except (OSError, ValueError):
            raise _Refused(404, "the blob is gone (its round has ended)") from None
        with file:
            size = file.seek(0, 2)
            file.seek(0)
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            while chunk := file.read(CHUNK):
                if time.time() > grant.expires:
                    raise _Refused(408, "the transfer outlived its round")
                self.wfile.write(chunk)
        self.server.counts.count("fetched", size)

    def _checked_upload(self) -> tuple[Grant, int]:
        """The grant an upload is made under and its size, or why it is refused."""
        if self.path != "/v1/uploads":
            raise _Refused(404, "no such resource")
        grant = self._grant()
        try:
            size = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise _Refused(411, "an upload needs a Content-Length") from None
        if size < 0 or size > grant.upload_limit:
            raise _Refused(413, f"an upload of {size} bytes is over this round's limit "
                                f"({grant.upload_limit})")  # fmt: skip
        return grant, size

    def _put(self) -> None:
        checked = self.__dict__.pop("_upload_grant", None)
        grant, size = checked if checked is not None else self._checked_upload()
        spool = self.server.spool
        try:
            part = spool.upload_part(grant)
        except FileExistsError:
            raise _Refused(409, "this token's upload is already there") from None
        digest, left = hashlib.sha256(), size
        try:
            with part:
                while left:
                    if time.time() > grant.expires:
                        raise _Refused(408, "the transfer outlived its round")
                    chunk = self.rfile.read(min(CHUNK, left))
                    if not chunk:
                        raise _Refused(400, f"the upload ended {left} bytes short")
                    digest.update(chunk)
                    part.write(chunk)
                    left -= len(chunk)
            spool.finish_upload(grant, digest.hexdigest(), size)
        except BaseException:
            spool.drop_part(grant)
            raise
        self.server.counts.count("uploaded", size)
        body = json.dumps({"upload": grant.id, "digest": digest.hexdigest(), "size": size})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())


class Counts:
    """What the server has done: transfers and bytes by kind (``fetched``, ``uploaded``,
    ``refused``), for the coordinator's console."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.transfers: dict[str, int] = {"fetched": 0, "uploaded": 0, "refused": 0}
        self.bytes: dict[str, int] = {"fetched": 0, "uploaded": 0, "refused": 0}
        self._fetches: dict[tuple[str, str], int] = {}

    def fetch_allowed(self, grant: str, blob: str) -> bool:
        """Count a fetch of ``blob`` under ``grant``; whether it is within ``MAX_FETCHES``."""
        with self._lock:
            if len(self._fetches) > 100_000:  # grants end with their rounds: forget old ones
                self._fetches.clear()
            count = self._fetches.get((grant, blob), 0) + 1
            self._fetches[(grant, blob)] = count
            return count <= MAX_FETCHES

    def count(self, kind: str, size: int) -> None:
        with self._lock:
            self.transfers[kind] += 1
            self.bytes[kind] += size

    def line(self) -> str:
        """One line for people: ``6 fetched (81,212,345 bytes), 6 uploaded (...), 0 refused``."""
        with self._lock:
            return ", ".join(
                f"{self.transfers[kind]} {kind}"
                + (f" ({self.bytes[kind]:,} bytes)" if kind != "refused" else "")
                for kind in ("fetched", "uploaded", "refused")
            )


class BulkServer(ThreadingHTTPServer):
    """The server (see the module), serving in a thread of its own from ``start``.

    Parameters
    ----------
    address : tuple[str, int]
        Where to listen (port 0: any free one; ``port`` says which).
    spool : Spool
        The folder shared with the ServerApp.
    tls : tuple[Path, Path] | None
        The coordinator's certificate chain and key (the Fleet API's); ``None``: plain HTTP
        (``--insecure``).
    node_allowed : Callable[[int], bool]
        Whether a node id's site is still registered (default: every node).
    """

    daemon_threads = True
    request_queue_size = MAX_CONNECTIONS

    def __init__(
        self,
        address: tuple[str, int],
        spool: Spool,
        tls: tuple[Path, Path] | None,
        node_allowed: Callable[[int], bool] = lambda node: True,
    ) -> None:
        self.spool, self.node_allowed = spool, node_allowed
        self.counts = Counts()
        self.context: ssl.SSLContext | None = None
        if tls is not None:
            self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.context.minimum_version = ssl.TLSVersion.TLSv1_2
            self.context.load_cert_chain(str(tls[0]), str(tls[1]))
        self.hellos: dict[object, threading.Timer] = {}
        self.waiting: OrderedDict[int, tuple[list, str]] = OrderedDict()
        self._waiting_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._stopping = threading.Event()
        super().__init__(address, _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def process_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        if not self._slots.acquire(blocking=False):
            # full: make room by cutting the oldest connection still without its headers,
            # of the address that holds most of them (a flood evicts itself first)
            if not self._evict_one_waiting() or not self._slots.acquire(timeout=EVICT_WAIT_S):
                self.shutdown_request(request)
                return
        super().process_request(request, client_address)

    def _evict_one_waiting(self) -> bool:
        with self._waiting_lock:
            if not self.waiting:
                return False
            counts: dict[str, int] = {}
            for _, address in self.waiting.values():
                counts[address] = counts.get(address, 0) + 1
            crowded = max(counts, key=lambda address: counts[address])
            key = next(k for k, (_, address) in self.waiting.items() if address == crowded)
            held, _ = self.waiting.pop(key)
        _cut(held)
        return True

    def headers_in(self, connection: object) -> None:
        """``connection``'s request headers have arrived: it is no longer evictable."""
        with self._waiting_lock:
            for key, (held, _) in list(self.waiting.items()):
                if held[0] is connection:
                    del self.waiting[key]

    def finish_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        request.settimeout(IO_TIMEOUT_S)
        held = [request]  # the TLS socket replaces the plain one once it is made
        timer = threading.Timer(HELLO_DEADLINE_S, _cut, (held,))
        timer.daemon = True
        timer.start()
        with self._waiting_lock:
            self.waiting[id(held)] = (held, str(client_address[0]))
        try:
            if self.context is not None:
                held[0] = request = self.context.wrap_socket(
                    request, server_side=True, do_handshake_on_connect=False
                )
                try:
                    request.do_handshake()
                except (OSError, ssl.SSLError):
                    request.close()
                    return  # not TLS, or too slow to say hello
            self.hellos[request] = timer
            super().finish_request(request, client_address)
        finally:
            timer.cancel()
            self.hellos.pop(request, None)
            with self._waiting_lock:
                self.waiting.pop(id(held), None)

    def process_request_thread(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        log.debug("transfer from %s failed", client_address, exc_info=True)

    def start(self) -> BulkServer:
        """Serve in daemon threads (and sweep the spool every ``SWEEP_EVERY_S``); returns
        ``self``."""
        threading.Thread(target=self.serve_forever, name="bulk-server", daemon=True).start()
        threading.Thread(target=self._sweeping, name="bulk-sweep", daemon=True).start()
        return self

    def _sweeping(self) -> None:
        while not self._stopping.wait(SWEEP_EVERY_S):
            try:
                self.spool.sweep()
            except OSError:
                log.debug("sweep failed", exc_info=True)

    def close(self) -> None:
        """Stop serving and release the port."""
        self._stopping.set()
        self.shutdown()
        self.server_close()


def _cut(held: list) -> None:
    """End the connection in ``held`` that missed ``HELLO_DEADLINE_S`` (its thread's read
    returns)."""
    try:
        held[0].shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
