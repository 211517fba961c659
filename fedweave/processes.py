"""Child processes that end with us: start tied to our life, stop a whole process group, turn
SIGTERM into the same clean stop as Ctrl-C. Used by the coordinator, the site and the
simulations."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys


def die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the parent dies, even by kill -9 (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def tied_to_us() -> dict:
    """``subprocess.Popen`` keywords: its own session, and SIGTERM when we die (Linux)."""
    return {
        "start_new_session": True,
        "preexec_fn": die_with_parent if sys.platform == "linux" else None,
    }


def stop_process_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the child's process group, wait ``grace`` s, then SIGKILL what is left
    (Flower's SuperExec and app processes included)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def raise_interrupt(signum: int, _frame) -> None:
    """A SIGTERM handler: stop the way Ctrl-C does (the callers clean up on KeyboardInterrupt)."""
    raise KeyboardInterrupt(f"signal {signum}")
