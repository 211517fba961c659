"""Round deadlines: how long a round waits for its sites, and SecAgg+ held to the same clock.

A plain round makes one message round trip; Flower 1.41's default fit workflow waits for it
without a limit, so ``deadline_fit_workflow`` hands that workflow a grid whose
``send_and_receive`` returns the replies that came in by the deadline. A SecAgg+ round makes
four round trips (key advertisement, key shares, masked updates, unmasking);
``DeadlineSecAggPlusWorkflow`` gives each stage what is left of the round's deadline, so the
whole round closes at it (the unmasking stage keeps a short floor: without it, every site's
update would be lost).

Sites that have not answered when the round closes are recorded ``late`` by the reporting
strategy; their replies, if they come, answer messages nobody pulls again, so they are
discarded and never mixed into a later round.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from fedweave.flower_patches.secagg_stages import (  # noqa: F401 (STAGES: bench_secagg_cohort)
    STAGES,
    StagedSecAggPlusWorkflow,
)

if TYPE_CHECKING:  # torch: only a default deadline's timing needs it (the coordinator
    # process imports this module, and without that timing it never loads torch)
    from fedweave.learning.task import ArrayData, Task
    from fedweave.learning.training import TrainConfig

DEADLINE_FLOOR_SECONDS = 120.0
"""The shortest default deadline: covers starting a site's ClientApp for each of SecAgg+'s
four messages on a loaded 2-core machine (~7 s each), with room to spare."""
WORK_FACTOR = 20.0
"""Default deadline = this × the local work timed on the coordinator's held-out set (sites
hold more data than that, and may run on slower machines)."""
NO_DATA_DEADLINE_SECONDS = 300.0
"""The first rounds' default deadline when the coordinator holds no data to time the task's
local work on; later rounds' is measured (``RoundDeadline``), never longer than this."""
MEASURED_FACTOR = 5.0
"""A measured deadline = this × the slowest training seconds any site reported so far (a
round also pays each site's start-up and the transfers), at least ``DEADLINE_FLOOR_SECONDS``."""
FINAL_STAGE_FLOOR_SECONDS = 5.0
KEY_STAGE_SHARE = 0.15
"""Each SecAgg+ key stage (advertise keys, share keys) waits at most this share of the round's
deadline, and at least ``KEY_STAGE_FLOOR_SECONDS``: they are a few milliseconds of crypto per
site, so a site silent for that long is missing, and the protocol drops it (it tolerates
dropouts down to its threshold) instead of the first stage using up the whole deadline and
halting the round for everyone, which is what a site whose link was cut did before."""
KEY_STAGE_FLOOR_SECONDS = 5.0

log = logging.getLogger("fedweave.secagg")


def default_round_timeout(task: Task, data: ArrayData, config: TrainConfig) -> float:
    """The deadline a round gets when ``--round-timeout`` is not given: sized from the task by
    timing one site's local work (``config.epochs`` epochs) on ``data``; RNG state is kept."""
    import torch

    with torch.random.fork_rng(devices=[]):
        model = task.build_model()
        started = time.perf_counter()
        task.train(model, data, config)
        seconds = time.perf_counter() - started
    return max(DEADLINE_FLOOR_SECONDS, WORK_FACTOR * seconds)


class RoundDeadline:
    """How long each round waits for its sites, read when the round starts.

    Fixed (``--round-timeout``, or sized from the coordinator's held-out data), or, when the
    coordinator holds no data, measured: ``seconds`` until a round records its sites'
    training seconds, then ``MEASURED_FACTOR`` × the slowest a site reported so far, kept
    between ``DEADLINE_FLOOR_SECONDS`` and the starting ``seconds`` (a site's figure is its
    own word: claiming a long time cannot hold later rounds open beyond that, and one site
    claiming a short time cannot cut the others' deadline, which follows the slowest).

    Args:
        seconds: the deadline in seconds (the first rounds' when measured).
        measured: whether later rounds' deadline is sized from the sites' reported times.
    """

    def __init__(self, seconds: float, measured: bool = False) -> None:
        self.seconds = float(seconds)
        self.measured = measured
        self.ceiling = float(seconds)
        self.slowest_site_seconds = 0.0

    def __repr__(self) -> str:
        return f"RoundDeadline({self.seconds:g} s{', measured' if self.measured else ''})"

    def on_round(self, summary) -> None:  # type: ignore[no-untyped-def]
        """A round listener: fold the sites' reported training seconds into the deadline."""
        if not self.measured:
            return
        reported = [
            site.seconds
            for site in summary.sites
            if site.status == "ok" and site.seconds is not None and site.seconds > 0
        ]
        if not reported:
            return
        self.slowest_site_seconds = max(self.slowest_site_seconds, *reported)
        sized = MEASURED_FACTOR * self.slowest_site_seconds
        seconds = min(self.ceiling, max(DEADLINE_FLOOR_SECONDS, sized))
        if seconds != self.seconds:
            log.info(
                "round deadline now %.0f s (%g x the slowest site's %.1f s of training)",
                seconds, MEASURED_FACTOR, self.slowest_site_seconds,
            )  # fmt: skip
        self.seconds = seconds


class _DeadlineGrid:
    """A grid whose ``send_and_receive`` waits at most ``timeout`` seconds unless told
    otherwise; everything else is the wrapped grid's."""

    def __init__(self, grid, deadline: RoundDeadline) -> None:
        self._grid, self._deadline = grid, deadline

    def send_and_receive(self, messages, *, timeout: float | None = None):
        return self._grid.send_and_receive(
            messages, timeout=self._deadline.seconds if timeout is None else timeout
        )

    def __getattr__(self, name: str):
        return getattr(self._grid, name)


def deadline_fit_workflow(deadline: RoundDeadline, spooled=None):  # type: ignore[no-untyped-def]
    """Flower's default fit workflow (one plain round) closing ``deadline.seconds`` after its
    instructions go out, with the replies it has by then; ``spooled`` (``SpooledUpdates``):
    the round's updates stay on disk until its strategy has added them up, and go after."""
    from contextlib import nullcontext

    from fedweave.flower_patches.default_workflow import default_fit_workflow

    def fit_workflow(grid, context) -> None:
        with spooled.collecting() if spooled is not None else nullcontext():
            default_fit_workflow(_DeadlineGrid(grid, deadline), context)

    return fit_workflow


class DeadlineSecAggPlusWorkflow(StagedSecAggPlusWorkflow):
    """Flower's SecAgg+ workflow whose four stages share one round deadline.

    The policy is here; running Flower's workflow stage by stage (which relies on its
    internals) is ``fedweave.flower_patches.secagg_stages``, as is taking the sites that sent
    no keys out of the round (``forget_sites_without_keys``).

    Parameters
    ----------
    deadline : RoundDeadline
        Seconds from the round's first SecAgg+ message until it closes (``round_timeout``).
        Each stage waits at most what is left of it (and at most the workflow's own per-stage
        ``timeout``); the two key stages at most ``KEY_STAGE_SHARE`` of it (at least
        ``KEY_STAGE_FLOOR_SECONDS``), except in the first round this workflow runs, whose first
        message also pays every site's start-up; the unmasking stage waits at least
        ``FINAL_STAGE_FLOOR_SECONDS``.
    **kwargs
        ``SecAggPlusWorkflow``'s own parameters.
    """

    def __init__(self, deadline: RoundDeadline, **kwargs) -> None:
        super().__init__(**kwargs)
        self.deadline = deadline
        self._deadline = 0.0
        self._rounds_run = 0

    @property
    def round_timeout(self) -> float:
        """This round's deadline in seconds."""
        return self.deadline.seconds

    def begin_round(self) -> None:
        """Start the round's clock."""
        self._deadline = time.monotonic() + self.round_timeout

    def end_round(self) -> None:
        """Log each stage's seconds (DEBUG, ``fedweave.secagg``, the record's
        ``stage_seconds``)."""
        self._rounds_run += 1
        log.debug(
            "SecAgg+ stages (s): %s",
            ", ".join(f"{name} {sec:.3f}" for name, sec in self.stage_seconds.items()),
            extra={"stage_seconds": dict(self.stage_seconds)},
        )

    def stage_wait(self, name: str) -> float | None:
        """What is left of the round's deadline (see the class); None when nothing is, except
        for unmasking (halt the round rather than send messages no site could answer in
        time; unmasking with nothing left would lose every site's update)."""
        if name == "unmask":
            floor, cap = FINAL_STAGE_FLOOR_SECONDS, None
        elif name in ("setup", "share_keys"):
            floor, cap = 0.0, self._key_stage_cap()
        else:
            floor, cap = 0.0, None
        left = max(floor, self._deadline - time.monotonic())
        if left <= 0:
            return None
        return min(self.stage_timeout, left, cap if cap is not None else left)

    def _key_stage_cap(self) -> float | None:
        if self._rounds_run == 0:
            return None
        return max(KEY_STAGE_SHARE * self.round_timeout, KEY_STAGE_FLOOR_SECONDS)
