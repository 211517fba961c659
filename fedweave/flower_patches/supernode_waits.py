"""Bounded waits in Flower's SuperNode (applied by ``fedweave.flower_patches``).

Two changes to ``flwr.supernode.start_client_internal``, the loop a site's SuperNode runs:

- **Shorter sleeps.** The loop sleeps 3 s whenever the SuperLink has no message for the site
  and 0.5 s between looks for the ClientApp's reply, so every message of a round waited up to
  3.5 s for nothing. Sleeps are capped at ``SLEEP_CAP_SECONDS`` (0.2 s: measured on 2 cores,
  shorter polls cost more CPU than they saved; docs/deploy.md) while the site is busy: until
  ``ACTIVE_SECONDS`` after its last message (``STARTING_SECONDS`` after its first ask). A site
  idle longer asks
  every ``IDLE_POLL_SECONDS`` (1 s; stock Flower: 3 s): each ask costs the SuperNode and the
  SuperLink ~10 ms of CPU, so three idle sites asking every 0.2 s kept 0.3 of a core busy.
- **A reply wait with an end.** After handing a message to its ClientApp, the SuperNode
  waits for the reply with no limit. A ClientApp that ends without one (it could not pull its
  message, say, because the coordinator was restarted and stopped the run the message
  belonged to) left the site deaf to every later message: the stalled resumed run of a
  CI failure. fedweave's wait ends once no ClientApp task is pending or running and
  none has replied; the unanswered message is dropped and the site pulls the next one.
- **A shorter first object-pull backoff** (``object_pulls``): instructions whose weights are
  not uploaded yet are pulled again after 0.05 s, not 1 s.
"""

from __future__ import annotations

import time
import types
from logging import WARNING

from fedweave.poll_pace import PollPace

SLEEP_CAP_SECONDS = 0.2
ACTIVE_SECONDS = 10.0
"""How long after its last message a site keeps asking every ``SLEEP_CAP_SECONDS``: a run's
next message comes within it (the next SecAgg+ stage, the evaluation, the next round),
unless the round waits for a slow site."""
STARTING_SECONDS = 30.0
"""How long after its first ask (its first connection) a site asks every ``SLEEP_CAP_SECONDS``:
the coordinator starts its run once enough sites are connected, and Flower's ServerApp takes
seconds to start. A reconnection to a restarted coordinator is paced as any wait: its first
message waits at most ``IDLE_POLL_SECONDS`` longer."""
IDLE_POLL_SECONDS = 1.0
"""How often a site idle for longer than ``ACTIVE_SECONDS`` asks for a message."""
STOCK_IDLE_SLEEP_SECONDS = 3.0
"""The sleep Flower's loop takes when the SuperLink had no message for the site."""
NO_TASK_GRACE_SECONDS = 2.0
"""How long no ClientApp task may be alive, with no reply, before the message is dropped
(covers the moment between a task being finished and its reply being visible)."""

_UNFINISHED = ("pending", "starting", "running")


def _capped_sleep(seconds: float) -> None:
    time.sleep(min(seconds, SLEEP_CAP_SECONDS))


_PACE = PollPace(
    busy=SLEEP_CAP_SECONDS, idle=IDLE_POLL_SECONDS, active=ACTIVE_SECONDS,
    starting=STARTING_SECONDS,
)  # fmt: skip


def _loop_sleep(seconds: float) -> None:
    """The loop's ``time.sleep``: its idle sleep paced (``fedweave.poll_pace``), the others
    capped."""
    if seconds >= STOCK_IDLE_SLEEP_SECONDS:
        time.sleep(_PACE.wait())
    else:
        _capped_sleep(seconds)


class _Prefetched:
    """The node state, but the first look for replies returns those already fetched (Flower's
    state hands each message out once, and the stock push code looks for them itself)."""

    def __init__(self, state, replies) -> None:
        self._state, self._replies = state, replies

    def get_messages_legacy(self, **filters):
        if filters.get("is_reply") and self._replies is not None:
            replies, self._replies = self._replies, None
            return replies
        return self._state.get_messages_legacy(**filters)

    def __getattr__(self, name: str):
        return getattr(self._state, name)


def _wait_for_replies(state):
    """The ClientApp's replies, or None once no task is alive to send one."""
    quiet_since = None
    while not (replies := state.get_messages_legacy(is_reply=True)):
        if state.get_tasks(statuses=_UNFINISHED):
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > NO_TASK_GRACE_SECONDS:
            return None
        _capped_sleep(SLEEP_CAP_SECONDS)
    return replies


def install() -> None:
    """Apply both changes (the version guard is the caller's)."""
    from flwr.supercore import log
    from flwr.supernode import start_client_internal as loop

    if getattr(loop, "_fedweave_patched", False):
        return
    stock_push = loop._push_messages

    def push_messages(state, object_store, send, push_object) -> None:
        # Flower's loop pushes only after it pulled a message: the site is busy from here
        # until its reply is sent (training may take longer than ACTIVE_SECONDS)
        _PACE.worked()
        try:
            replies = _wait_for_replies(state)
            if replies is None:
                log(
                    WARNING,
                    "fedweave: the ClientApp ended without replying; dropping its message "
                    "and pulling the next one",
                )
                state.delete_messages()  # no reply exists: only unanswered instructions remain
                return
            stock_push(_Prefetched(state, replies), object_store, send, push_object)
        finally:
            _PACE.worked()

    from fedweave.flower_patches import object_pulls

    loop._push_messages = push_messages
    object_pulls.install_in(loop)
    loop.time = types.SimpleNamespace(**{**vars(time), "sleep": _loop_sleep})
    loop._fedweave_patched = True
