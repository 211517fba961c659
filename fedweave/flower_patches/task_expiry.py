"""A dead ClientApp's message answered in seconds, not a minute (applied by
``fedweave.flower_patches``).

A site's SuperNode answers a message its ClientApp took with Flower's "ClientApp stopped
responding" error once the task's heartbeat lapses. Flower 1.41 lets a task go
``HEARTBEAT_PATIENCE`` (2) × ``HEARTBEAT_DEFAULT_INTERVAL`` (30 s) without one, so a site's
worker killed mid-message (out of memory, a crashed GPU driver) held its round for about a
minute. Both ends of that heartbeat are fedweave's processes on the site's machine:

- the worker (``fedweave.client.worker``, through ``clientapp_worker.task_heartbeat``) beats
  as Flower paces a ``TASK_HEARTBEAT_INTERVAL`` of 10 s: every (10 − 5 s call timeout) × 0.7
  to 0.9, so every 3.5 to 4.5 s, over loopback;
- the SuperNode of a site that runs that worker (``--isolation process``) lets a task go
  2 × 10 s = 20 s without a beat before it answers the message as failed.

A site whose SuperNode starts Flower's own ``flwr-clientapp`` per message (no worker) beats
and waits as stock Flower does.
"""

from __future__ import annotations

TASK_HEARTBEAT_INTERVAL = 10.0
"""Seconds: the interval Flower paces a task's heartbeat and its expiry by (Flower's
``HEARTBEAT_DEFAULT_INTERVAL``, 30 s; its ``HEARTBEAT_MIN_INTERVAL`` is 10 s)."""


def beat_often() -> None:
    """The worker's side: its task heartbeats come every 3.5 to 4.5 s (harmless where the
    SuperNode waits longer)."""
    from flwr.supercore import heartbeat

    heartbeat.HEARTBEAT_DEFAULT_INTERVAL = TASK_HEARTBEAT_INTERVAL


def install() -> None:
    """The SuperNode's side: a task without a heartbeat for 20 s has ended (the version
    guard, and the check that the site runs fedweave's worker, are the caller's)."""
    from flwr.supercore.corestate import in_memory_corestate

    in_memory_corestate.HEARTBEAT_DEFAULT_INTERVAL = TASK_HEARTBEAT_INTERVAL
