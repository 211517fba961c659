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
from collections.abc import Callable

from flwr.server.workflow import SecAggPlusWorkflow

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
STAGES = ("setup", "share_keys", "collect_masked_vectors", "unmask")


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


def deadline_fit_workflow(deadline: RoundDeadline):
    """Flower's default fit workflow (one plain round) closing ``deadline.seconds`` after its
    instructions go out, with the replies it has by then."""
    from flwr.server.workflow.default_workflows import default_fit_workflow

    def fit_workflow(grid, context) -> None:
        default_fit_workflow(_DeadlineGrid(grid, deadline), context)

    return fit_workflow


def forget_sites_without_keys(state) -> None:
    """Take the sites that did not answer SecAgg+'s key advertisement out of the round.

    Flower 1.41 keeps them among the round's sampled sites, so its unmasking stage lists them
    as dropped and asks the others for their key shares, which they never made (key shares
    go only to sites that advertised keys): every surviving site's ClientApp then fails with
    a ``KeyError`` and the whole round halts. Such a site shares no mask with anyone, so the
    protocol is unchanged by forgetting it, and the round goes on with the others. Runs only
    on the Flower version ``use_fedweave_secagg`` allows (it reads the workflow state).
    """
    silent = set(state.sampled_node_ids) - set(state.active_node_ids)
    if not silent:
        return
    state.sampled_node_ids -= silent
    for node_id in silent:
        state.nid_to_neighbours.pop(node_id, None)
    for neighbours in state.nid_to_neighbours.values():
        neighbours -= silent


class DeadlineSecAggPlusWorkflow(SecAggPlusWorkflow):
    """Flower's SecAgg+ workflow whose four stages share one round deadline.

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
        self.stage_timeout = self.timeout
        self._deadline = 0.0
        self._rounds_run = 0
        self.stage_seconds: dict[str, float] = {}
        """Wall seconds of each stage of the last round, by name in ``STAGES``."""

    @property
    def round_timeout(self) -> float:
        """This round's deadline in seconds."""
        return self.deadline.seconds

    def __call__(self, grid, context) -> None:
        """Run the protocol with the round's clock started; log each stage's seconds (DEBUG,
        ``fedweave.secagg``, the record's ``stage_seconds``)."""
        self._deadline = time.monotonic() + self.round_timeout
        self.stage_seconds = {}
        try:
            super().__call__(grid, context)
        finally:
            self._rounds_run += 1
            log.debug(
                "SecAgg+ stages (s): %s",
                ", ".join(f"{name} {sec:.3f}" for name, sec in self.stage_seconds.items()),
                extra={"stage_seconds": dict(self.stage_seconds)},
            )

    def _timed(self, name: str, stage: Callable[..., bool], *args) -> bool:
        started = time.perf_counter()
        try:
            return stage(*args)
        finally:
            self.stage_seconds[name] = time.perf_counter() - started

    def _left(self, floor: float = 0.0, cap: float | None = None) -> bool:
        """Set this stage's timeout to what is left (at most ``cap``); False when nothing is
        (halt the round rather than send messages no site could answer in time)."""
        left = max(floor, self._deadline - time.monotonic())
        self.timeout = min(self.stage_timeout, left, cap if cap is not None else left)
        return left > 0

    def _key_stage_cap(self) -> float | None:
        if self._rounds_run == 0:
            return None
        return max(KEY_STAGE_SHARE * self.round_timeout, KEY_STAGE_FLOOR_SECONDS)

    def setup_stage(self, grid, context, state) -> bool:
        """Key advertisement, within its share of the round's deadline; a site that sent no
        keys is then out of the round (``forget_sites_without_keys``)."""
        if not self._left(cap=self._key_stage_cap()):
            return False
        enough = self._timed("setup", super().setup_stage, grid, context, state)
        forget_sites_without_keys(state)
        return enough

    def share_keys_stage(self, grid, context, state) -> bool:
        """Key shares, within its share of the round's deadline."""
        cap = self._key_stage_cap()
        return self._left(cap=cap) and self._timed(
            "share_keys", super().share_keys_stage, grid, context, state
        )

    def collect_masked_vectors_stage(self, grid, context, state) -> bool:
        """Local training and the masked updates, within the round's deadline."""
        return self._left() and self._timed(
            "collect_masked_vectors", super().collect_masked_vectors_stage, grid, context, state
        )

    def unmask_stage(self, grid, context, state) -> bool:
        """Unmasking: what is left of the deadline, but never less than the floor."""
        self._left(FINAL_STAGE_FLOOR_SECONDS)
        return self._timed("unmask", super().unmask_stage, grid, context, state)
