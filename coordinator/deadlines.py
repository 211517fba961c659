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
"""The default deadline when the coordinator holds no data to time the task's local work on
(``--round-timeout`` sets it; the sites' own training seconds are recorded each round)."""
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


class _DeadlineGrid:
    """A grid whose ``send_and_receive`` waits at most ``timeout`` seconds unless told
    otherwise; everything else is the wrapped grid's."""

    def __init__(self, grid, timeout: float) -> None:
        self._grid, self._timeout = grid, timeout

    def send_and_receive(self, messages, *, timeout: float | None = None):
        return self._grid.send_and_receive(
            messages, timeout=self._timeout if timeout is None else timeout
        )

    def __getattr__(self, name: str):
        return getattr(self._grid, name)


def deadline_fit_workflow(round_timeout: float):
    """Flower's default fit workflow (one plain round) closing ``round_timeout`` seconds after
    its instructions go out, with the replies it has by then."""
    from flwr.server.workflow.default_workflows import default_fit_workflow

    def fit_workflow(grid, context) -> None:
        default_fit_workflow(_DeadlineGrid(grid, round_timeout), context)

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
    round_timeout : float
        Seconds from the round's first SecAgg+ message until it closes. Each stage waits at
        most what is left of it (and at most the workflow's own per-stage ``timeout``); the
        two key stages at most ``KEY_STAGE_SHARE`` of it (at least
        ``KEY_STAGE_FLOOR_SECONDS``), except in the first round this workflow runs, whose first
        message also pays every site's start-up; the unmasking stage waits at least
        ``FINAL_STAGE_FLOOR_SECONDS``.
    **kwargs
        ``SecAggPlusWorkflow``'s own parameters.
    """

    def __init__(self, round_timeout: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.round_timeout = round_timeout
        self.stage_timeout = self.timeout
        self._deadline = 0.0
        self._rounds_run = 0
        self.stage_seconds: dict[str, float] = {}
        """Wall seconds of each stage of the last round, by name in ``STAGES``."""

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
