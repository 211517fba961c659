"""Object pulls that start sooner and end by a deadline (applied by the deployment patches of
``fedweave.flower_patches``).

Flower 1.41 sends a message's header before its objects (the weights), and whoever pulls it
backs off 1 s, then 2 s, 4 s ... when an object is not uploaded yet
(``flwr.supercore.inflatable.inflatable_utils.pull_objects``). With a ClientApp that answers
in a fraction of a second, nearly every pull of a round arrives that early: a site's SuperNode
pulling the coordinator's instructions, the coordinator pulling replies, and fedweave's
ClientApp worker pulling from its SuperNode each lost a second or three per message. fedweave
starts the backoff at ``FIRST_BACKOFF_SECONDS`` and keeps Flower's doubling, cap and limits.

Flower gives a pull up to two hours (``PULL_MAX_TIME``). A site that froze after sending its
reply's header and before its weights (a stopped VM, a severed link, an insider that never
uploads) would hold the coordinator that long inside ``HttpGrid.pull_messages``, past any
round deadline. Pulls made inside ``pulls_end_by(deadline)`` give up at the deadline instead
(at least ``LAST_PULL_SECONDS`` after they start); Flower then answers for that reply with an
error of code ``MESSAGE_UNAVAILABLE`` (``unavailable``).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

FIRST_BACKOFF_SECONDS = 0.05
LAST_PULL_SECONDS = 2.0
"""A reply whose header came by the deadline gets at least this long to finish uploading."""

_ends = threading.local()


@contextlib.contextmanager
def pulls_end_by(deadline: float | None) -> Iterator[None]:
    """Object pulls this thread makes inside the block give up ``deadline`` (``time.monotonic()``
    seconds; ``None``: Flower's own limits) or ``LAST_PULL_SECONDS`` after they start,
    whichever is later."""
    outer = getattr(_ends, "deadline", None)
    _ends.deadline = deadline
    try:
        yield
    finally:
        _ends.deadline = outer


def quick(pull: types.FunctionType):
    """``pull`` (Flower's ``pull_objects`` or ``pull_and_inflate_object_from_tree``) with the
    shorter first backoff, ending by the deadline of ``pulls_end_by`` when one is set."""

    @functools.wraps(pull)
    def pull_quickly(*args: Any, **kwargs: Any):
        kwargs.setdefault("initial_backoff", FIRST_BACKOFF_SECONDS)
        deadline = getattr(_ends, "deadline", None)
        if deadline is not None:
            kwargs["max_time"] = max(LAST_PULL_SECONDS, deadline - time.monotonic())
        return pull(*args, **kwargs)

    pull_quickly.fedweave_quick = True  # type: ignore[attr-defined]
    return pull_quickly


def unavailable(message: Any) -> bool:
    """Whether ``message`` is Flower's stand-in for a reply whose objects could not be pulled
    (by the deadline, or at all)."""
    from fedweave.flower_patches.message_records import ErrorCode

    return bool(message.has_error() and message.error.code == ErrorCode.MESSAGE_UNAVAILABLE)


def install_in(module: types.ModuleType) -> None:
    """Replace the ``pull_objects`` that ``module`` imported (the version guard is the caller's)."""
    if not getattr(module.pull_objects, "fedweave_quick", False):
        module.pull_objects = quick(module.pull_objects)
