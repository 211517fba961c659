"""Is the process that started a run still alive? (crash detection at the next start)

A run records the pid and hostname of its process and a heartbeat that every recorded
round refreshes. On the same host the pid answers the question exactly; on another host
only the heartbeat can, so a run there counts as dead once its heartbeat is older than a
stale limit (default 10 minutes, ``STALE_AFTER_S``).
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta
from pathlib import Path

STALE_AFTER_S = 600.0
"""A running run on another host whose heartbeat is older than this (s) is interrupted."""


def this_host() -> str:
    """The hostname recorded with runs started here."""
    return socket.gethostname()


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process on this host.

    Errs towards "alive" when it cannot tell (Windows, no permission), because marking a
    live run interrupted is worse than leaving a dead one running a little longer.
    """
    if pid <= 0:
        return False
    if os.name == "nt":  # os.kill(pid, 0) would terminate the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child that nobody has waited for yet is a zombie: dead for our purposes
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def run_is_dead(
    pid: int | None,
    hostname: str | None,
    heartbeat_at: datetime | None,
    now: datetime,
    stale_after_s: float = STALE_AFTER_S,
) -> bool:
    """Decide whether a run marked ``running`` has lost its process (see module docstring)."""
    if hostname == this_host() and pid is not None:
        return not pid_alive(pid)
    if heartbeat_at is None:
        return False
    return heartbeat_at < now - timedelta(seconds=stale_after_s)
