"""How often a loop that asks for work asks: often while work is coming, seldom once idle.

A deployed site asks twice for work: its SuperNode asks the coordinator's SuperLink for a
message (``flower_patches/supernode_waits.py``) and its worker asks the SuperNode for a
ClientApp task (``client/worker.py``). Within a run the next message follows within seconds
(the next SecAgg+ stage, the evaluation, the next round), so both ask every fraction of a
second; but each ask costs CPU on both ends (~10 ms through Flower's HTTP stack here), and a
site connected between runs asked that often for nothing: three idle sites kept ~0.4 of a
core busy on 2 cores. A loop paced by ``PollPace`` asks every ``busy`` seconds until
``active`` seconds have passed without work (``starting`` seconds after its first ask: a
site that just started waits for its connection and the run's first message), then every
``idle`` seconds, and often again after the next piece of work.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class PollPace:
    """The wait before a loop's next ask.

    Args:
        busy: seconds between asks while work came in the last ``active`` seconds.
        idle: seconds between asks after that (a message waits at most this long longer).
        active: how long after the last work the loop stays busy.
        starting: how long after its first ask the loop stays busy (default ``active``).
        clock: monotonic seconds (default ``time.monotonic``; tests pass their own).
    """

    def __init__(
        self,
        busy: float,
        idle: float,
        active: float,
        starting: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < busy <= idle:
            raise ValueError(f"need 0 < busy ({busy}) <= idle ({idle})")
        self.busy, self.idle, self.active = busy, idle, active
        self.starting = active if starting is None else starting
        self._clock = clock
        self._last_work: float | None = None

    def worked(self) -> None:
        """Work came (or was just finished): ask often again."""
        self._last_work = self._clock()

    def wait(self) -> float:
        """Seconds to wait before the next ask, when this ask found no work."""
        now = self._clock()
        if self._last_work is None:  # the first ask: busy for ``starting`` seconds
            self._last_work = now + self.starting - self.active
        return self.busy if now - self._last_work < self.active else self.idle
