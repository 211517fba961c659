"""Shorter polls in Flower's deployment engine (applied by ``fedweave.flower_patches``).

Flower 1.41's deployed ServerApp pulls replies every 3 s (``HttpGrid.send_and_receive``), so
every message round trip of a round (one for FedAvg, four for SecAgg+) waits up to 3 s for
nothing; fedweave's replacement does the same pushes and pulls through the grid's own public
``push_messages`` / ``pull_messages`` every ``GRID_POLL_SECONDS``. On 2 cores, polls much
shorter than that made rounds slower, not faster (docs/deploy.md has the figures). Replies
whose weights are not uploaded yet are pulled again after 0.05 s, not 1 s, and no longer than
the call's ``timeout`` (``object_pulls``): a reply whose weights did not arrive by then is left
out, as if its site had not answered (the round records it ``late``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

GRID_POLL_SECONDS = 0.2


def send_and_receive(self, messages: Iterable, *, timeout: float | None = None) -> list:
    """``HttpGrid.send_and_receive`` polling every ``GRID_POLL_SECONDS`` instead of 3 s, and
    returning by ``timeout`` even when a reply's objects never finish arriving."""
    from fedweave.flower_patches.object_pulls import pulls_end_by, unavailable

    waiting = set(self.push_messages(messages))
    deadline = None if timeout is None else time.monotonic() + timeout
    replies: list = []
    while waiting:
        started = time.monotonic()
        with pulls_end_by(deadline):
            pulled = list(self.pull_messages(waiting))
        replies.extend(m for m in pulled if not unavailable(m))
        waiting.difference_update(m.metadata.reply_to_message_id for m in pulled)
        # a pull that began before the deadline and was held past it by one reply's missing
        # weights is followed by one more: the replies that came meanwhile are on time
        if not waiting or (deadline is not None and started >= deadline):
            break
        if deadline is None or time.monotonic() < deadline:
            time.sleep(GRID_POLL_SECONDS)
    return replies


def install() -> None:
    """Apply the shorter grid poll and the shorter first object-pull backoff
    (``object_pulls``; the version guard is the caller's)."""
    from flwr.superlink.grid import http_grid

    from fedweave.flower_patches import object_pulls

    http_grid.HttpGrid.send_and_receive = send_and_receive
    object_pulls.install_in(http_grid)
