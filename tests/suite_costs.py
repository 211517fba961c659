"""What each test costs in CPU, beside pytest's seconds: two properties on every test case of
the JUnit XML ``scripts/test`` writes, summed per file by ``scripts/test-times.py``.

- ``cpu_seconds``: CPU used by the process running the test and by every process it started
  and waited for, children's children included (``getrusage``, the test's setup, call and
  teardown). Processes no one waited for are not in it: those killed or left behind with
  their parent (a deployed test ends by killing each process group it started, so a site's
  SuperNode and worker are missing), and Ray's daemons. Valid with or without pytest-xdist
  workers.
- ``machine_cpu_seconds``: CPU the whole machine was busy with meanwhile (``/proc/stat``);
  it counts everything, so it is the test's own only in a one-process run on a quiet machine.
- ``started`` (the wall clock as the test's setup began, Unix seconds) and ``worker`` (its
  pytest-xdist worker, ``gw0``; ``main`` without workers): when each worker was busy, and how
  long one waited at the end for the other (``scripts/test-times.py --workers``).

A test whose CPU is far below its seconds waits (deadlines, sleeps, polls); one whose CPU is
about its seconds, or above on 2 cores, is bound by the machine.
"""

from __future__ import annotations

import os
import resource
import time

import pytest

_STARTED = pytest.StashKey[tuple[float, float | None, float]]()
_TICKS = os.sysconf("SC_CLK_TCK")


def process_tree_cpu() -> float:
    """CPU seconds of this process and of its waited-for descendants."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def machine_busy_cpu() -> float | None:
    """CPU seconds the machine has spent on work since boot (user, nice, system, irq and
    softirq time), or None where ``/proc/stat`` cannot be read."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system = fields[:3]
    irq, softirq = fields[5:7] if len(fields) >= 7 else (0, 0)
    return (user + nice + system + irq + softirq) / _TICKS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    item.stash[_STARTED] = (process_tree_cpu(), machine_busy_cpu(), time.time())
    yield


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> None:
    """Before the teardown's report is made from ``item.user_properties`` (the JUnit XML writes
    a test's properties from that report)."""
    if call.when != "teardown" or _STARTED not in item.stash:
        return
    tree_before, machine_before, started = item.stash[_STARTED]
    item.user_properties.append(("started", round(started, 2)))
    item.user_properties.append(("worker", os.environ.get("PYTEST_XDIST_WORKER", "main")))
    item.user_properties.append(("cpu_seconds", round(process_tree_cpu() - tree_before, 2)))
    machine_now = machine_busy_cpu()
    if machine_before is not None and machine_now is not None:
        item.user_properties.append(("machine_cpu_seconds", round(machine_now - machine_before, 2)))
