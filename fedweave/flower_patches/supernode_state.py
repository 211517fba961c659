"""The site's SuperNode reports what happens to it as data (applied in its process by
``fedweave.flower_patches.launch``).

``fedweave client`` must know whether its SuperNode is connected, refused, retrying or has
seen a run end. Flower 1.41 says so only in its log, in words any release may change. This
patch wraps three of Flower's own functions in the SuperNode process and appends one JSON
line per event to the file named by ``SUPERNODE_STATE_FILE_ENV`` (set by ``fedweave client``
for its SuperNode only), which the site reads (``read_events``):

- ``fleet_http_connection.make_simple_http_retry_invoker``: the invoker behind every Fleet
  request. Its backoff, give-up and success handlers (Flower's ``RetryState``: the request,
  the exception, the wait) give ``retrying``, ``refused``, ``gave-up`` and ``recovered``.
  A refusal is decided from the HTTP status and Flower's error code in the response
  (``FlowerError.from_json``), a TLS failure from the ``ssl`` exception in the chain, never
  from a message's text.
- ``start_client_internal.http_request_response``: the connection the SuperNode's loop
  opens; once it is open, ``connected`` with the node id.
- its ``receive`` callback: ``message`` with the run id and round (the message's
  ``group_id``) when either changes, and ``run-ended`` when a run the site took part in is
  no longer running: Flower's ``GetRun``, asked while the site waits between messages,
  answers ``RunNotRunningException``, or a message of another run arrives.

Events (every line also has ``time``, seconds since the epoch):

``{"event": "connected", "node_id": N}``
``{"event": "retrying", "call": "PullMessages", "wait_s": 1.3, "error": "connect"}``
``{"event": "recovered", "call": "PullMessages"}``
``{"event": "refused", "why": "unknown-key", "http_status": 412, "flower_code": 2004}``
(``why``: ``unknown-key``, ``needs-key`` or ``signature``; see ``REFUSALS``)
``{"event": "gave-up", "call": "ActivateNode", "error": "tls", "tls_verify_code": 20}``
``{"event": "message", "run_id": R, "round": "3"}``
``{"event": "run-ended", "run_id": R}``

``error`` is ``connect``, ``timeout``, ``transport``, ``tls`` or ``http-NNN``. The file stops
growing at ``MAX_STATE_FILE_BYTES``; the site then still has the SuperNode's exit code and
its probes of the coordinator's address.
"""

from __future__ import annotations

import json
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SUPERNODE_STATE_FILE_ENV = "FEDWEAVE_SUPERNODE_STATE_FILE"
MAX_STATE_FILE_BYTES = 4 * 1024 * 1024
"""The writer stops here (a site unreachable for days retries every 20 s, ~100 bytes each)."""
MAX_EVENT_LINE_BYTES = 4096
"""A longer line is not an event of ours; the reader skips it."""
RUN_CHECK_FIRST_S = 5.0
RUN_CHECK_MAX_S = 60.0
"""While the site waits between messages of a run, it asks the coordinator whether the run
still runs after ``RUN_CHECK_FIRST_S``, then at doubling intervals up to ``RUN_CHECK_MAX_S``
(each ask is one line in the coordinator's log)."""

REFUSALS: dict[tuple[str, int], str] = {
    ("ActivateNode", 2004): "unknown-key",
    ("RegisterNode", 2001): "needs-key",
}
"""(Fleet request, Flower's error code) → why the coordinator refused this site. 2004,
``ApiErrorCode.FLEET_NODE_ACTIVATION_FAILED``: no node has this public key (never
registered, or revoked); 2001, ``FLEET_SUPERNODE_REGISTRATION_DISABLED``: the coordinator
admits registered keys only and this site has none. Checked against Flower's enum when the
patch is installed."""


class EventWriter:
    """Appends events to ``path``, one JSON line each, thread-safe, up to
    ``MAX_STATE_FILE_BYTES``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "time": round(time.time(), 3), **fields})
        with self._lock:
            try:
                if os.path.getsize(self.path) > MAX_STATE_FILE_BYTES:
                    return
            except OSError:
                pass  # not there yet: created below
            try:
                with open(self.path, "a", encoding="utf-8") as out:
                    out.write(line + "\n")
            except OSError:
                pass  # the site falls back on the exit code and its probes


def read_events(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The complete events appended to ``path`` from byte ``offset`` on, and the offset to
    read from next. Lines that are not a JSON object with a string ``event``, or longer than
    ``MAX_EVENT_LINE_BYTES``, are skipped; a line still being written is left for the next
    read. A missing file has no events."""
    try:
        with open(path, "rb") as source:
            source.seek(offset)
            chunk = source.read(MAX_STATE_FILE_BYTES + MAX_EVENT_LINE_BYTES)
    except OSError:
        return [], offset
    events: list[dict[str, Any]] = []
    end = chunk.rfind(b"\n") + 1  # 0: no complete line yet
    for raw in chunk[:end].splitlines():
        if len(raw) > MAX_EVENT_LINE_BYTES:
            continue
        try:
            event = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(event, dict) and isinstance(event.get("event"), str):
            events.append(event)
    return events, offset + end


def exit_code_name(code: int) -> str:
    """The name of a SuperNode exit status in Flower's ``ExitCode`` (e.g. 305:
    ``SUPERNODE_CONNECTION_ERROR``), or ``unknown``."""
    from flwr.supercore.exit import ExitCode

    names = {value: name for name, value in vars(ExitCode).items() if isinstance(value, int)}
    return names.get(code, "unknown")


def _call_name(target: Callable[..., Any]) -> str:
    return str(getattr(target, "__name__", type(target).__name__))


def _tls_failure(exc: BaseException) -> ssl.SSLError | None:
    """The ``ssl`` error under an httpx/httpcore exception (its cause chain), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def describe_error(exc: BaseException | None) -> dict[str, Any]:
    """What kind of failure ``exc`` is, as event fields (``error`` and, for TLS, OpenSSL's
    verify code; for an HTTP answer, its status and Flower's error code)."""
    import httpx

    if exc is None:
        return {"error": "unknown"}
    if isinstance(exc, httpx.HTTPStatusError):
        from flwr.supercore.error import FlowerError

        fields: dict[str, Any] = {
            "error": f"http-{exc.response.status_code}",
            "http_status": exc.response.status_code,
        }
        flower_error = FlowerError.from_json(exc.response.text)
        if flower_error is not None and isinstance(flower_error.code, int):
            fields["flower_code"] = flower_error.code
        return fields
    tls = _tls_failure(exc)
    if tls is not None:
        fields = {"error": "tls"}
        if isinstance(tls, ssl.SSLCertVerificationError):
            fields["tls_verify_code"] = tls.verify_code
        return fields
    if isinstance(exc, httpx.TimeoutException):
        return {"error": "timeout"}
    if isinstance(exc, httpx.ConnectError):
        return {"error": "connect"}
    return {"error": "transport"}


def _with_events(invoker: Any, emit: EventWriter) -> Any:
    """``invoker`` (Flower's ``RetryInvoker``) with its handlers also emitting events."""
    stock_backoff, stock_giveup = invoker.on_backoff, invoker.on_giveup
    stock_success, stock_should_giveup = invoker.on_success, invoker.should_giveup

    def on_backoff(state: Any) -> None:
        emit(
            "retrying",
            call=_call_name(state.target),
            wait_s=round(float(state.actual_wait or 0.0), 2),
            **describe_error(state.exception),
        )
        if stock_backoff is not None:
            stock_backoff(state)

    def on_giveup(state: Any) -> None:
        call, fields = _call_name(state.target), describe_error(state.exception)
        why = REFUSALS.get((call, fields.get("flower_code", -1)))
        if why is not None:
            emit("refused", why=why, call=call, **fields)
        else:
            emit("gave-up", call=call, tries=state.tries, **fields)
        if stock_giveup is not None:
            stock_giveup(state)

    def on_success(state: Any) -> None:
        if state.tries > 1:
            emit("recovered", call=_call_name(state.target), tries=state.tries)
        if stock_success is not None:
            stock_success(state)

    def should_giveup(exc: Exception) -> bool:
        import httpx

        # Flower answers 401 by stopping its own process (SIGINT) before any give-up
        # handler runs: the request's signature was refused (a clock off, or a key mismatch).
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 401:
            emit("refused", why="signature", **describe_error(exc))
        return bool(stock_should_giveup(exc)) if stock_should_giveup is not None else False

    invoker.on_backoff, invoker.on_giveup = on_backoff, on_giveup
    invoker.on_success, invoker.should_giveup = on_success, should_giveup
    return invoker


class _RunWatch:
    """Follows the runs the site's messages belong to, and asks Flower's ``GetRun`` whether
    the last one still runs while the site waits for its next message."""

    def __init__(self, emit: EventWriter, get_run: Callable[[int], Any]) -> None:
        self.emit, self.get_run = emit, get_run
        self.run_id: int | None = None
        self.round: str | None = None
        self.next_check = 0.0
        self.check_every = RUN_CHECK_FIRST_S

    def seen(self, run_id: int, round_id: str) -> None:
        if self.run_id is not None and run_id != self.run_id:
            self.emit("run-ended", run_id=self.run_id)
        if (run_id, round_id) != (self.run_id, self.round):
            self.emit("message", run_id=run_id, round=round_id)
        self.run_id, self.round = run_id, round_id
        self.check_every = RUN_CHECK_FIRST_S
        self.next_check = time.monotonic() + self.check_every

    def idle(self) -> None:
        if self.run_id is None or time.monotonic() < self.next_check:
            return
        from flwr.supercore.run import RunNotRunningException

        self.check_every = min(self.check_every * 2, RUN_CHECK_MAX_S)
        self.next_check = time.monotonic() + self.check_every
        try:
            self.get_run(self.run_id)
        except RunNotRunningException:  # Flower's answer for a finished (or stopped) run
            self.emit("run-ended", run_id=self.run_id)
            self.run_id = self.round = None
        except Exception:  # noqa: BLE001 - a failed look; the retry events say why
            pass


def install() -> None:
    """Wrap Flower's functions (the version guard and fingerprints are the caller's); a
    no-op without ``SUPERNODE_STATE_FILE_ENV``."""
    from flwr.supercore.error import ApiErrorCode
    from flwr.supernode import fleet_http_connection
    from flwr.supernode import start_client_internal as loop

    path = os.environ.get(SUPERNODE_STATE_FILE_ENV)
    if not path or getattr(loop, "_fedweave_state_patched", False):
        return
    expected = {"ActivateNode": "FLEET_NODE_ACTIVATION_FAILED",
                "RegisterNode": "FLEET_SUPERNODE_REGISTRATION_DISABLED"}  # fmt: skip
    for (call, code), _ in REFUSALS.items():
        if getattr(ApiErrorCode, expected[call]) != code:
            raise RuntimeError(f"Flower's error code {expected[call]} is not {code}")
    emit = EventWriter(path)
    stock_invoker = fleet_http_connection.make_simple_http_retry_invoker
    stock_connection = loop.http_request_response

    def make_simple_http_retry_invoker() -> Any:
        return _with_events(stock_invoker(), emit)

    @contextmanager
    def http_request_response(*args: Any, **kwargs: Any) -> Iterator[tuple[Any, ...]]:
        with stock_connection(*args, **kwargs) as conn:
            node_id, receive, *rest = conn
            get_run = rest[1]  # (send, get_run, get_fab, ...): Flower's tuple, fingerprinted
            watch = _RunWatch(emit, get_run)

            def receive_noting_runs() -> Any:
                received = receive()
                if received is None:
                    watch.idle()
                else:
                    metadata = received[0].metadata
                    watch.seen(int(metadata.run_id), str(metadata.group_id or ""))
                return received

            emit("connected", node_id=int(node_id))
            yield (node_id, receive_noting_runs, *rest)

    fleet_http_connection.make_simple_http_retry_invoker = make_simple_http_retry_invoker
    loop.http_request_response = http_request_response
    loop._fedweave_state_patched = True
