"""ZeroMQ transport for gossip: one ROUTER inbox per peer, one DEALER per neighbour.

Why this shape (see DESIGN.md, "ZeroMQ"): a DEALER connected to several peers round-robins,
so each neighbour gets its own DEALER; replies come back on it. The inbox ROUTER answers
offers on the connection they came from. No REQ/REP: its lockstep hangs forever on a dead
peer. Every socket has ``LINGER=0`` (closing never blocks on a dead peer), small high-water
marks (a slow peer cannot make us buffer many models), ``MAXMSGSIZE`` (oversized frames drop
the connection inside libzmq before they reach Python) and every wait is ``poll(timeout_s)``.
Sends are non-blocking and zero-copy; a full queue or a vanished route returns ``False``.

``MAXMSGSIZE`` bounds one frame, not a message: messages are read frame by frame and one
whose frames add up to more than the limit is released as it is read and marked
``oversize`` (the inbox counts it ``too-large``). ZeroMQ delivers a multipart message whole,
so libzmq has buffered all of it by then; only a small ``MAXMSGSIZE`` (``limit_frames``: a
peer's largest tensor) stops big frames before they are buffered (PROTOCOL.md §6).

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
from fedweave.gossip.wire import DEFAULT_MAX_MESSAGE_BYTES, MAX_HEADER_BYTES

log = logging.getLogger("fedweave.gossip.transport")

DEFAULT_HWM = 8
"""Messages queued per connection before sends fail (models are big: keep it small)."""
RETIRE_SECONDS = 2.0
"""Delay between dropping a neighbour's DEALER and closing it (see ``disconnect``)."""
KEEPALIVE_S = 1
"""TCP keepalive: an idle connection is probed after this many seconds, then every this many
seconds; ``KEEPALIVE_PROBES`` unanswered probes close it (a host gone silent, with no FIN or
RST, is seen lost within about 4 s instead of at the next missed deadline)."""
KEEPALIVE_PROBES = 3
MAX_UNACKED_MS = 3000
"""``TCP_MAXRT`` (Linux ``TCP_USER_TIMEOUT``): sent data unacknowledged this long closes the
connection, for a host that went silent mid-transfer (keepalive only probes idle ones).

Not ZMTP heartbeats (``HEARTBEAT_IVL``), which this transport used before: libzmq 4.3.5 (the
one pyzmq bundles, and its master as of 2026-07) aborts the whole process (``Assertion failed:
!_io_error (src/stream_engine_base.cpp:310)``) when a heartbeat is due on a connection whose
input was stopped at the high-water mark and which then hung up: its timer calls
``out_event`` without checking ``_io_error``. Any sender that queues more than ``hwm``
messages while we train and then disconnects did that; an allowed member flooding offers
killed an honest peer this way (issue 39). ``tests/test_gossip_network.py`` replays it."""
CURVE_FRAME_OVERHEAD = 33
"""Bytes CURVE adds to every frame on the wire (``\\x07MESSAGE``, an 8-byte nonce, a flags
byte and a 16-byte MAC), which libzmq counts against ``MAXMSGSIZE``: without them a frame
exactly as large as the limit (a model's largest tensor, which every offer carries) broke the
connection under CURVE, so a peer whose largest tensor is over 64 KiB never mixed."""
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
    oversize: bool = False
    """Its frames added up to more than the whole-message limit: only the header was kept."""

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
        max_message_bytes: the largest accepted message, all its tensor frames together
            (default 1 GiB); a message over it (plus one header) is dropped as it is read.
        hwm: send/receive high-water mark in messages per connection (default 8).
        max_frame_bytes: ``MAXMSGSIZE``, the largest single frame libzmq accepts before it
            drops the connection (default: ``max_message_bytes``). A peer knows its model, so
            it sets this to its largest tensor: libzmq keeps every frame of a multipart
            message until the last one arrives, and only this per-frame cut happens before
            that (PROTOCOL.md §6).
    """

    def __init__(
        self,
        listen: str,
        keyring: KeyRing | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        hwm: int = DEFAULT_HWM,
        max_frame_bytes: int | None = None,
    ) -> None:
        self.keyring = keyring
        self.max_message_bytes = max_message_bytes
        self.max_total_bytes = max_message_bytes + MAX_HEADER_BYTES
        """Whole-message limit as read: the tensors' limit plus one header frame."""
        self.max_frame_bytes = _frame_limit(max_message_bytes, max_frame_bytes)
        self.hwm = hwm
        self.context = zmq.Context()
        self._auth: Any = None
        self._dealers: dict[str, zmq.Socket] = {}
        self._monitors: dict[str, tuple[zmq.Socket, list[int]]] = {}
        self._retired: list[tuple[float, zmq.Socket]] = []
        self._opened: dict[str, float] = {}
        """When each DEALER was opened (``time.monotonic()``), for ``connecting``."""
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

    def limit_frames(self, max_frame_bytes: int) -> None:
        """Lower ``MAXMSGSIZE`` once the model is known (its largest tensor), before anyone
        connects. libzmq copies socket options into a listener when it binds, so the inbox is
        bound again on the same endpoint."""
        limit = _frame_limit(self.max_message_bytes, max_frame_bytes)
        if limit == self.max_frame_bytes:
            return
        self.max_frame_bytes = limit
        self.inbox.unbind(self.address)
        self.inbox.setsockopt(zmq.MAXMSGSIZE, self._wire_frame_limit())
        deadline = time.monotonic() + 5.0
        while True:  # unbind closes the listener in libzmq's I/O thread, a moment later
            try:
                self.inbox.bind(self.address)
                return
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                    from fedweave.errors import UserError

                    raise UserError(
                        f"cannot listen on {self.address} again ({exc.strerror}); is another "
                        "program taking this port? pick a free --listen tcp://HOST:PORT"
                    ) from exc
                time.sleep(0.01)

    def _configure(self, sock: zmq.Socket) -> None:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self.hwm)
        sock.setsockopt(zmq.RCVHWM, self.hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, self._wire_frame_limit())
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        sock.setsockopt(zmq.HANDSHAKE_IVL, 5000)
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)  # kernel probes, never ZMTP heartbeats (above)
        sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, KEEPALIVE_S)
        sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, KEEPALIVE_S)
        sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_PROBES)
        sock.setsockopt(zmq.TCP_MAXRT, MAX_UNACKED_MS)

    def _wire_frame_limit(self) -> int:
        """``MAXMSGSIZE`` for a frame of ``max_frame_bytes``: libzmq counts a frame as it is
        on the wire, encrypted under CURVE."""
        return self.max_frame_bytes + (CURVE_FRAME_OVERHEAD if self.keyring is not None else 0)

    def _start_auth(self, keyring: KeyRing) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        allowed = set(keyring.allowed.values())
        told: set[bytes] = set()

        class _AllowList:
            """ZAP callback: accept exactly the Z85 keys of ``allowed/``; say once per key
            which peer id was refused (the id the other side goes by, not key bytes)."""

            def callback(self, domain: str, key: bytes) -> bool:
                ok = key in allowed
                if not ok and key not in told and len(told) < 1000:
                    told.add(key)
                    try:
                        who = f"peer {peer_id_from_public_key(key)}"
                    except ValueError:
                        who = "a peer with a malformed key"
                    log.warning(
                        "refused a connection from %s: its key is not in this peer's "
                        "allowed/ (if it belongs, copy its peer.key in with `fedweave keys "
                        "allow FILE` and restart)",
                        who,
                    )
                return ok

        self._auth = ThreadAuthenticator(self.context, log=logging.getLogger("fedweave.zap"))
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=_AllowList())

    # -- neighbours --------------------------------------------------------------------

    def connect(
        self, key: str, addr: str, server_key: bytes | None = None, watch: bool = False
    ) -> None:
        """Open (or keep) a DEALER named ``key`` to ``addr``; with CURVE, pin ``server_key``.

        Its connection events are counted (``handshakes``, ``lost`` and the like) from
        before the first one: a refusal ends libzmq's reconnecting, so a monitor attached
        after ``connect`` can miss the only event there will ever be (``watch`` is kept for
        callers; every DEALER is watched)."""
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
        self._watch_handshakes(key, sock)  # every DEALER: refusals, mix-ups, lost links
        sock.connect(addr)
        self._dealers[key] = sock
        self._opened[key] = time.monotonic()
        self._poller.register(sock, zmq.POLLIN)

    def rename(self, old: str, new: str) -> None:
        """Re-key a DEALER once the peer id behind a seed address is known."""
        if old == new or old not in self._dealers:
            return
        if new in self._dealers:
            self.disconnect(old)
            return
        self._dealers[new] = self._dealers.pop(old)
        self._opened[new] = self._opened.pop(old, time.monotonic())
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
        self._opened.pop(key, None)
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
        """Count the connection events of DEALER ``key`` (``handshakes``, ``key_refused``,
        ``mechanism_mismatch``, ``connect_refused``): a seed or neighbour whose key is not
        the one pinned, that does not allow ours, that speaks the other mechanism (CURVE
        against plaintext) or where nothing listens never answers, and these say which."""
        events = (
            zmq.EVENT_CONNECTED
            | zmq.EVENT_DISCONNECTED
            | zmq.EVENT_CONNECT_RETRIED
            | zmq.EVENT_HANDSHAKE_SUCCEEDED
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        )
        monitor = sock.get_monitor_socket(events)
        self._monitors[key] = (monitor, [0] * len(_COUNTS))
        self._poller.register(monitor, zmq.POLLIN)

    def _drain_monitor(self, key: str) -> list[int]:
        entry = self._monitors.get(key)
        if entry is None:
            return [0] * len(_COUNTS)
        monitor, counts = entry
        for _ in range(1000):  # bounded: events arrive a few per reconnect
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            kind, value = event["event"], event["value"]
            if kind == zmq.EVENT_DISCONNECTED:
                counts[_DOWN] = 1 if counts[_UP] else counts[_DOWN]
                counts[_UP] = 0
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                counts[_OK] += 1
                counts[_UP], counts[_DOWN] = 1, 0
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                counts[_REFUSED] += 1
            elif kind == zmq.EVENT_CONNECTED:
                counts[_CONNECTED] += 1
            elif kind == zmq.EVENT_CONNECT_RETRIED:
                counts[_RETRIED] += 1
            else:
                counts[_FAILED] += 1
                if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                    counts[_MISMATCH] += 1
        return counts

    def handshakes(self, key: str) -> tuple[int, int, int]:
        """(failed, succeeded, refused) CURVE handshakes of a watched DEALER so far; refused:
        the other side checked our key and said no (libzmq then stops reconnecting)."""
        counts = self._drain_monitor(key)
        return counts[_FAILED], counts[_OK], counts[_REFUSED]

    def key_refused(self, key: str) -> bool:
        """The peer behind DEALER ``key`` refused our CURVE key and never accepted it."""
        counts = self._drain_monitor(key)
        return counts[_REFUSED] > 0 and counts[_OK] == 0

    def mechanism_mismatch(self, key: str) -> bool:
        """A handshake of DEALER ``key`` failed because one side speaks CURVE and the other
        plaintext."""
        return self._drain_monitor(key)[_MISMATCH] > 0

    def lost(self, key: str) -> bool:
        """The connection of DEALER ``key`` was up and went down (the process there died or
        closed it; a host gone silent shows after the keepalive probes or ``MAX_UNACKED_MS``):
        a reply will not come on it."""
        return self._drain_monitor(key)[_DOWN] > 0

    def connect_refused(self, key: str) -> bool:
        """DEALER ``key`` retried its TCP connection (nothing accepted it) and never
        connected."""
        counts = self._drain_monitor(key)
        return counts[_RETRIED] > 0 and counts[_CONNECTED] == 0

    def connected_once(self, key: str) -> bool:
        """DEALER ``key`` had a TCP connection at some point."""
        return self._drain_monitor(key)[_CONNECTED] > 0

    def unwatch_handshakes(self, key: str) -> None:
        entry = self._monitors.pop(key, None)
        if entry is None:
            return
        self._poller.unregister(entry[0])
        sock = self._dealers.get(key)
        if sock is not None:
            sock.disable_monitor()
        entry[0].close(0)

    def connecting(self, key: str, within: float) -> bool:
        """DEALER ``key`` was opened less than ``within`` seconds ago and (when watched) has
        not completed a handshake yet: a send that fails now says nothing about the peer."""
        opened = self._opened.get(key)
        if opened is None or time.monotonic() - opened >= within:
            return False
        return key not in self._monitors or self._drain_monitor(key)[_OK] == 0

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
        monitors = {entry[0]: key for key, entry in self._monitors.items()}
        for sock in events:
            if sock in monitors:
                self._drain_monitor(monitors[sock])
                continue
            for _ in range(MAX_MESSAGES_PER_POLL):
                try:
                    frames, nbytes, oversize = self._recv_bounded(sock, sock is self.inbox)
                except zmq.Again:
                    break
                self.bytes_in += nbytes
                if sock is self.inbox:
                    route, frames = frames[0].bytes, frames[1:]
                    address = _property(frames, "Peer-Address")
                    incoming = Incoming(frames, route, None, self._user_id(frames), nbytes, address)
                else:
                    incoming = Incoming(frames, None, names.get(sock), None, nbytes)
                incoming.oversize = oversize
                out.append(incoming)
        return out

    def _recv_bounded(self, sock: zmq.Socket, routed: bool) -> tuple[list[Any], int, bool]:
        """One message, read frame by frame (``RCVMORE``) against the whole-message limit.

        ``MAXMSGSIZE`` bounds each frame only, so twenty frames just under it would add up
        to twenty times the limit. Once the running total passes ``max_total_bytes`` the
        frames read so far are released and the rest of the message is read and released
        one frame at a time: Python never holds more than the limit plus one frame, and the
        message is never decoded. Returns (frames kept, bytes of the whole message, whether
        it was over the limit: then the frames kept are only the routing id and header, for
        counting and logging). ``zmq.Again`` when nothing is queued.
        """
        first = sock.recv(flags=zmq.NOBLOCK, copy=False)
        frames: list[Any] = [first]
        total = _nbytes(frames)
        keep = 2 if routed else 1  # routing id and header survive an oversize drop
        oversize = False
        more = first.more
        while more:
            frame = sock.recv(copy=False)  # the rest of a message is already queued
            more = frame.more
            total += memoryview(frame.buffer).nbytes
            if oversize:
                continue  # released at once: never kept
            frames.append(frame)
            if total > self.max_total_bytes:
                oversize = True
                del frames[keep:]
        return frames, total, oversize

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


_FAILED, _OK, _REFUSED, _MISMATCH, _CONNECTED, _RETRIED, _UP, _DOWN = range(8)
_COUNTS = range(8)
"""Indices of a watched DEALER's event counters (``_UP``: a connection is up now;
``_DOWN``: the connection that was up went down, and none came back yet)."""


def _frame_limit(max_message_bytes: int, max_frame_bytes: int | None) -> int:
    """Per-frame limit: at most the message limit, at least room for a header frame."""
    return max(min(max_message_bytes, max_frame_bytes or max_message_bytes), MAX_HEADER_BYTES)


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
