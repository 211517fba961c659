"""Web doors that callers without a credential cannot close: uvicorn's HTTP/1.1 protocol with
a deadline for each request's headers and a bound on connections still sending them.

uvicorn has no header deadline (data trickling in cancels its keep-alive timer) and answers
503 to everyone once ``limit_concurrency`` connections are open, so 80 connections sending a
byte now and then closed the operator door and the dashboard to every operator. Here:

- a request's headers must arrive within ``HEADER_SECONDS`` of the connection (or of the
  previous response), or the connection is closed;
- at most ``MAX_WAITING`` connections may be waiting for their headers; one more makes room
  by closing the oldest waiting connection of the address that holds the most of them, so a
  caller that sends its headers at once (an operator, a browser) always gets in, and a flood
  from one address evicts itself first.

A request answered before its body was read (the operator door refuses an unknown token from
the headers alone) is closed at once, whatever of the body is still coming. What happens
otherwise after the headers is the app's (the operator door gives a body ``BODY_SECONDS``).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_SECONDS = 5.0
"""Seconds from a connection's arrival (or its previous response) to its request's headers."""
MAX_WAITING = 32
"""Connections of one server that may be waiting for their headers at once."""


class _Waiting:
    """The connections of one server still waiting for their request's headers, oldest first."""

    def __init__(self) -> None:
        self.order: OrderedDict[GuardedH11Protocol, str] = OrderedDict()

    def admit(self, protocol: GuardedH11Protocol, address: str) -> None:
        self.order[protocol] = address
        while len(self.order) > MAX_WAITING:
            others = [(held, at) for held, at in self.order.items() if held is not protocol]
            counts: dict[str, int] = {}
            for _, at in others:
                counts[at] = counts.get(at, 0) + 1
            crowded = max(counts, key=lambda at: counts[at])
            oldest = next(held for held, at in others if at == crowded)
            self.order.pop(oldest)
            oldest.transport.close()

    def leave(self, protocol: GuardedH11Protocol) -> None:
        self.order.pop(protocol, None)


_WAITING: dict[int, _Waiting] = {}
"""``id(server_state)`` → its waiting connections (one uvicorn server, one state)."""


class GuardedH11Protocol(H11Protocol):
    """uvicorn's ``H11Protocol`` with a header deadline and a bound on connections waiting
    for their headers (see the module)."""

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._wait_for_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the request's headers are in
            self._headers_in()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.SEND_BODY:  # answered before its body was read
            self.transport.close()  # (a refused token): nothing more of it is wanted
        elif self.conn.their_state is h11.IDLE:
            self._wait_for_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_in()
        super().connection_lost(exc)
        if not self.connections:
            _WAITING.pop(id(self.server_state), None)

    def _wait_for_headers(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(HEADER_SECONDS, self._too_slow)
        waiting = _WAITING.setdefault(id(self.server_state), _Waiting())
        waiting.admit(self, self.client[0] if self.client else "?")

    def _headers_in(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        waiting = _WAITING.get(id(self.server_state))
        if waiting is not None:
            waiting.leave(self)

    def _too_slow(self) -> None:
        self._deadline = None
        self._headers_in()
        if not self.transport.is_closing():
            self.transport.close()
