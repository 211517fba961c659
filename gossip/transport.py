"""ZeroMQ transport for gossip: one ROUTER inbox per peer, one DEALER per neighbour.

Why this shape (see DESIGN.md, "ZeroMQ"): a DEALER connected to several peers round-robins,
so each neighbour gets its own DEALER; replies come back on it. The inbox ROUTER answers
offers on the connection they came from. No REQ/REP: its lockstep hangs forever on a dead
peer. Every socket has ``LINGER=0`` (closing never blocks on a dead peer), small high-water
marks (a slow peer cannot make us buffer many models), ``MAXMSGSIZE`` (oversized frames drop
the connection inside libzmq before they reach Python) and every wait is ``poll(timeout_s)``.
Sends are non-blocking and zero-copy; a full queue or a vanished route returns ``False``.

With a ``KeyRing`` every socket speaks CURVE: the inbox is a CURVE server whose ZAP handler
(``zmq.auth.ThreadAuthenticator``) accepts only public keys in ``allowed/``; each DEALER pins
its neighbour's public key, so it only ever talks to that peer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from fedweave.gossip.keys import KeyRing, peer_id_from_public_key
from fedweave.gossip.wire import DEFAULT_MAX_MESSAGE_BYTES

log = logging.getLogger("fedweave.gossip.transport")

DEFAULT_HWM = 8
"""Messages queued per connection before sends fail (models are big: keep it small)."""
RETIRE_SECONDS = 2.0
"""Delay between dropping a neighbour's DEALER and closing it (see ``disconnect``)."""
MAX_MESSAGES_PER_POLL = 64
"""Drain at most this many messages per socket per poll, so one flooding peer cannot starve
the others or the peer's own round."""


@dataclass
class Incoming:
    """One received message, before decoding.

    Attributes:
        frames: the message frames (header first), without the ZeroMQ routing id.
        route: the inbox routing id to pass to ``reply`` (``None`` for neighbour replies).
        neighbour: the DEALER key the message arrived on (``None`` for the inbox).
        authenticated_id: the peer id of the CURVE key ZeroMQ authenticated, when secure.
        nbytes: total bytes of the frames.
        peer_address: the remote IP (ZeroMQ ``Peer-Address``), for logs and rate limits.
    """

    frames: list[Any]
    route: bytes | None
    neighbour: str | None
    authenticated_id: str | None
    nbytes: int
    peer_address: str | None = None

    @property
    def origin(self) -> str:
        """A printable name for logs and rate limits (no header needed)."""
        if self.authenticated_id:
            return self.authenticated_id
        if self.neighbour is not None:
            return self.neighbour
        if self.peer_address:
            return "host " + self.peer_address
        return "route-" + (self.route or b"").hex()[:16]


class Transport:
    """Sockets of one peer. Not thread-safe: one thread owns it (ZeroMQ sockets are not).

    Args:
        listen: endpoint to bind, e.g. ``tcp://0.0.0.0:7000`` (port 0 picks a free one;
            ``address`` then holds the real endpoint).
        keyring: CURVE identity and allow-list, or ``None`` for plaintext (default).
        max_message_bytes: ``MAXMSGSIZE`` per frame (default 1 GiB).
        hwm: send/receive high-water mark in messages per connection (default 8).
    """

    def __init__(
        self,
        listen: str,
        keyring: KeyRing | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        hwm: int = DEFAULT_HWM,
    ) -> None:
        self.keyring = keyring
        self.max_message_bytes = max_message_bytes
        self.hwm = hwm
        self.context = zmq.Context()
        self._auth: Any = None
        self._dealers: dict[str, zmq.Socket] = {}
        self._monitors: dict[str, tuple[zmq.Socket, list[int]]] = {}
        self._retired: list[tuple[float, zmq.Socket]] = []
        self._poller = zmq.Poller()
        self.bytes_in = 0
        self.bytes_out = 0
        self.inbox = self.context.socket(zmq.ROUTER)
        self._configure(self.inbox)
        self.inbox.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if keyring is not None:
            self._start_auth(keyring)
            self.inbox.curve_secretkey = keyring.identity.secret_key
            self.inbox.curve_publickey = keyring.identity.public_key
            self.inbox.curve_server = True
        try:
            self.inbox.bind(listen)
        except zmq.ZMQError as exc:
            self.close()
            from fedweave.errors import UserError

            raise UserError(
                f"cannot listen on {listen} ({exc.strerror}); pick a free --listen tcp://HOST:PORT"
            ) from exc
        self.address = self.inbox.getsockopt_string(zmq.LAST_ENDPOINT)
        self._poller.register(self.inbox, zmq.POLLIN)

    def _configure(self, sock: zmq.Socket) -> None:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self.hwm)
        sock.setsockopt(zmq.RCVHWM, self.hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        sock.setsockopt(zmq.HANDSHAKE_IVL, 5000)

    def _start_auth(self, keyring: KeyRing) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        allowed = set(keyring.allowed.values())

        class _AllowList:
            """ZAP callback: accept exactly the Z85 keys of ``allowed/``."""

            def callback(self, domain: str, key: bytes) -> bool:
                ok = key in allowed
                if not ok:
                    log.warning("refused a connection with an unknown CURVE key %s", key[:8])
                return ok

        self._auth = ThreadAuthenticator(self.context, log=logging.getLogger("fedweave.zap"))
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=_AllowList())

    # -- neighbours --------------------------------------------------------------------

    def connect(
        self, key: str, addr: str, server_key: bytes | None = None, watch: bool = False
    ) -> None:
        """Open (or keep) a DEALER named ``key`` to ``addr``; with CURVE, pin ``server_key``.

        ``watch`` counts its CURVE handshakes (read with ``handshakes``) from before the first
        one: a refusal ends libzmq's reconnecting, so a monitor attached after ``connect``
        can miss the only event there will ever be."""
        if key in self._dealers:
            return
        sock = self.context.socket(zmq.DEALER)
        self._configure(sock)
        if self.keyring is not None:
            if server_key is None:
                sock.close(0)
                raise ValueError(f"CURVE needs the public key of {addr}")
            sock.curve_secretkey = self.keyring.identity.secret_key
            sock.curve_publickey = self.keyring.identity.public_key
            sock.curve_serverkey = server_key
        if watch:
            self._watch_handshakes(key, sock)
        sock.connect(addr)
        self._dealers[key] = sock
        self._poller.register(sock, zmq.POLLIN)

    def rename(self, old: str, new: str) -> None:
        """Re-key a DEALER once the peer id behind a seed address is known."""
        if old == new or old not in self._dealers:
            return
        if new in self._dealers:
            self.disconnect(old)
            return
        self._dealers[new] = self._dealers.pop(old)
        if old in self._monitors:
            self._monitors[new] = self._monitors.pop(old)

    def disconnect(self, key: str) -> None:
        """Stop using the DEALER ``key`` now and close it ``RETIRE_SECONDS`` later.

        Why not at once: libzmq 4.3.5 aborts the whole process (``errno_assert`` in
        ``session_base_t::clean_pipes``, "Resource temporarily unavailable") when a socket is
        closed while its connection is failing in the middle of a multipart model message,
        which is exactly when a neighbour says ``bye`` or dies. Closing a little later, once
        its connection has settled, avoids that window; nothing is sent on it meanwhile.
        """
        self.unwatch_handshakes(key)
        sock = self._dealers.pop(key, None)
        if sock is not None:
            self._poller.unregister(sock)
            self._retired.append((time.monotonic() + RETIRE_SECONDS, sock))

    def _close_retired(self, everything: bool = False) -> None:
        now = time.monotonic()
        keep = []
        for due, sock in self._retired:
            if everything or due <= now:
                sock.close(0)
            else:
                keep.append((due, sock))
        self._retired = keep

    # -- handshakes (seeds) --------------------------------------------------------------

    def _watch_handshakes(self, key: str, sock: zmq.Socket) -> None:
        """Count the CURVE handshakes of DEALER ``key``: with a seed whose key is not the one
        pinned, or that does not allow ours, every one fails."""
        events = (
            zmq.EVENT_HANDSHAKE_SUCCEEDED
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        )
        self._monitors[key] = (sock.get_monitor_socket(events), [0, 0, 0])

    def handshakes(self, key: str) -> tuple[int, int, int]:
        """(failed, succeeded, refused) CURVE handshakes of a watched DEALER so far; refused:
        the other side checked our key and said no (libzmq then stops reconnecting)."""
        entry = self._monitors.get(key)
        if entry is None:
            return 0, 0, 0
        monitor, counts = entry
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                counts[1] += 1
            elif event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                counts[2] += 1
            else:
                counts[0] += 1
        return counts[0], counts[1], counts[2]

    def unwatch_handshakes(self, key: str) -> None:
        entry = self._monitors.pop(key, None)
        if entry is None:
            return
        sock = self._dealers.get(key)
        if sock is not None:
            sock.disable_monitor()
        entry[0].close(0)

    def connected(self, key: str) -> bool:
        return key in self._dealers

    def neighbour_keys(self) -> list[str]:
        return list(self._dealers)

    # -- sending -----------------------------------------------------------------------

    def send(self, key: str, frames: list[Any]) -> bool:
        """Queue ``frames`` to neighbour ``key`` without blocking; ``False`` if it cannot take
        them now (no such DEALER, or its queue is at the high-water mark)."""
        sock = self._dealers.get(key)
        if sock is None:
            return False
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        self.bytes_out += _nbytes(frames)
        return True

    def reply(self, route: bytes, frames: list[Any]) -> bool:
        """Answer on the inbox connection ``route``; ``False`` if it is gone or full
        (``ROUTER_MANDATORY`` turns a silent drop into an error we can count)."""
        try:
            self.inbox.send_multipart([route, *frames], flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return False
            raise
        self.bytes_out += _nbytes(frames)
        return True

    # -- receiving ---------------------------------------------------------------------

    def poll(self, timeout_s: float) -> list[Incoming]:
        """Wait at most ``timeout_s`` seconds for messages on any socket and return them all
        (at most ``MAX_MESSAGES_PER_POLL`` per socket)."""
        if self._retired:
            self._close_retired()
        events = dict(self._poller.poll(max(0, int(timeout_s * 1000))))
        out: list[Incoming] = []
        if not events:
            return out
        names = {sock: key for key, sock in self._dealers.items()}
        for sock in events:
            for _ in range(MAX_MESSAGES_PER_POLL):
                try:
                    frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                nbytes = _nbytes(frames)
                self.bytes_in += nbytes
                if sock is self.inbox:
                    route, frames = frames[0].bytes, frames[1:]
                    address = _property(frames, "Peer-Address")
                    out.append(
                        Incoming(frames, route, None, self._user_id(frames), nbytes, address)
                    )
                else:
                    out.append(Incoming(frames, None, names.get(sock), None, nbytes))
        return out

    def _user_id(self, frames: list[Any]) -> str | None:
        if self.keyring is None or not frames:
            return None
        key = _property(frames, "User-Id")
        try:
            return peer_id_from_public_key(key.encode("ascii")) if key else None
        except ValueError:
            return None

    def close(self, linger_ms: int = 0) -> None:
        """Close every socket, stop the authenticator, end the context.

        ``linger_ms`` lets already-queued messages (a final ``bye``) leave for at most that
        long; the default 0 drops them so closing never waits on a dead peer."""
        for key in list(self._monitors):
            self.unwatch_handshakes(key)
        for key in list(self._dealers):
            sock = self._dealers.pop(key)
            self._poller.unregister(sock)
            sock.close(linger_ms)
        self._close_retired(everything=True)
        inbox = getattr(self, "inbox", None)
        if inbox is not None and not inbox.closed:
            inbox.close(0)
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        self.context.term()


def _property(frames: list[Any], name: str) -> str | None:
    """A ZeroMQ message property (``User-Id``, ``Peer-Address``) or ``None``."""
    if not frames:
        return None
    try:
        return frames[0].get(name)
    except (zmq.ZMQError, AttributeError):
        return None


def _nbytes(frames: list[Any]) -> int:
    total = 0
    for frame in frames:
        buffer = getattr(frame, "buffer", frame)
        total += memoryview(buffer).nbytes
    return total


def wait_until(deadline: float) -> float:
    """Seconds left until ``deadline`` (a ``time.monotonic`` value), never negative."""
    return max(0.0, deadline - time.monotonic())
