"""CPU quotas for benchmarks and tests: run a process (and its children) held to a share of
one CPU by a cgroup (v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us``), as a site on a shared,
slow server would be. Needs root and a writable cgroup CPU controller."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path


class CpuQuota:
    """A cgroup that holds the processes started through ``command`` to ``share`` of one
    CPU (cgroup v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us``); ``remove()`` deletes it once its
    processes are gone."""

    def __init__(self, name: str, share: float) -> None:
        period = 100_000
        v2 = Path("/sys/fs/cgroup")
        if (
            "cpu" in (v2 / "cgroup.controllers").read_text().split()
            if (v2 / "cgroup.controllers").exists()
            else False
        ):
            self.path = v2 / name
            self.path.mkdir()
            (self.path / "cpu.max").write_text(f"{int(share * period)} {period}")
        else:
            self.path = Path("/sys/fs/cgroup/cpu") / name
            self.path.mkdir()
            (self.path / "cpu.cfs_period_us").write_text(str(period))
            (self.path / "cpu.cfs_quota_us").write_text(str(int(share * period)))

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the cgroup, from its first instruction (children inherit)."""
        procs = self.path / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *argv]

    def hold(self, pids: Iterable[int]) -> None:
        """Move running processes into the cgroup (what they start later is born in it); a
        pid that has exited meanwhile is passed over."""
        procs = self.path / "cgroup.procs"
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                procs.write_text(str(pid))

    def remove(self) -> None:
        """Kill what is left in the cgroup (the site's SuperNode and worker outlive its
        process group for a moment) and delete it."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.2)  # its processes are still exiting
