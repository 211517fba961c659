"""Keeps Flower's process tree from outliving the coordinator: ``python -m
fedweave.procguard -- flower-superlink ...``.

Why: the SuperLink starts Flower's SuperExec in a new session, which starts
``flwr-serverapp`` per run. Those only watch their parent's pid (every 0.2 s) and then spend
seconds to minutes retrying a dead SuperLink, so after a ``kill -9`` of the coordinator they
linger as orphans, outside any process group we could kill. This guard makes itself the
*subreaper* of everything below it (Linux ``PR_SET_CHILD_SUBREAPER``), so orphans re-parent
to it, and it dies with the coordinator (``PR_SET_PDEATHSIG``, set by the coordinator when it
starts the guard). On SIGTERM/SIGINT, or when the SuperLink exits, it terminates every
descendant (SIGTERM, then SIGKILL after ``GRACE_S``) and exits with the SuperLink's code.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 5.0


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value)
    except (OSError, AttributeError):  # not Linux: the process-group kill is all we have
        pass


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, state letter), from /proc."""
    table: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            table[int(entry.name)] = (int(fields[1]), fields[0])
        except (OSError, IndexError, ValueError):
            continue
    return table


def descendants(root: int, table: dict[int, tuple[int, str]] | None = None) -> list[int]:
    """Live (not zombie) pids below ``root``."""
    table = _proc_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _state) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(0), []):
            queue.append(child)
            if table[child][1] not in ("Z", "X"):
                found.append(child)
    return found


def _reap(skip: int) -> None:
    """Wait for exited orphans (a subreaper's duty); ``skip`` is left for Popen to reap.

    Asks the kernel which child has exited (``waitid`` with ``WNOWAIT`` looks without
    reaping) rather than reading all of /proc every poll, which cost each guard ~1% of a core.
    """
    while True:
        try:
            exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return  # no children at all
        if exited is None or exited.si_pid == 0 or exited.si_pid == skip:
            return  # none has exited, or the one Popen reaps (the poll loop then ends)
        try:
            os.waitpid(exited.si_pid, os.WNOHANG)
        except ChildProcessError:
            pass


def kill_tree(skip: int, grace: float = GRACE_S) -> None:
    """SIGTERM every descendant, wait up to ``grace`` s, SIGKILL the rest."""
    me = os.getpid()
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        for pid in descendants(me):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(skip)
            if not descendants(me):
                return
            time.sleep(0.1)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m fedweave.procguard -- COMMAND...", file=sys.stderr)
        return 2
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    stopping: list[int] = []  # a plain list, not an Event: no locks inside a signal handler

    def on_signal(signum: int, _frame) -> None:
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    child = subprocess.Popen(argv)
    while not stopping and child.poll() is None:
        time.sleep(0.2)
        _reap(child.pid)
    kill_tree(child.pid)
    code = child.poll()
    return 128 + signal.SIGTERM if code is None else (code if code >= 0 else 128 - code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
