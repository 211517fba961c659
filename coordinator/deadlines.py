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

import time

from flwr.server.workflow import SecAggPlusWorkflow

from fedweave.learning.task import ArrayData, Task
from fedweave.learning.training import TrainConfig

DEADLINE_FLOOR_SECONDS = 120.0
"""The shortest default deadline: covers starting a site's ClientApp for each of SecAgg+'s
four messages on a loaded 2-core machine (~7 s each), with room to spare."""
WORK_FACTOR = 20.0
"""Default deadline = this × the local work timed on the coordinator's held-out set (sites
hold more data than that, and may run on slower machines)."""
FINAL_STAGE_FLOOR_SECONDS = 5.0


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


class DeadlineSecAggPlusWorkflow(SecAggPlusWorkflow):
    """Flower's SecAgg+ workflow whose four stages share one round deadline.

    Parameters
    ----------
    round_timeout : float
        Seconds from the round's first SecAgg+ message until it closes. Each stage waits at
        most what is left of it (and at most the workflow's own per-stage ``timeout``); the
        unmasking stage waits at least ``FINAL_STAGE_FLOOR_SECONDS``.
    **kwargs
        ``SecAggPlusWorkflow``'s own parameters.
    """

    def __init__(self, round_timeout: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.round_timeout = round_timeout
        self.stage_timeout = self.timeout
        self._deadline = 0.0

    def __call__(self, grid, context) -> None:
        """Run the protocol with the round's clock started."""
        self._deadline = time.monotonic() + self.round_timeout
        super().__call__(grid, context)

    def _left(self, floor: float = 0.0) -> bool:
        """Set this stage's timeout to what is left; False when nothing is (halt the round
        rather than send messages no site could answer in time)."""
        left = max(floor, self._deadline - time.monotonic())
        self.timeout = min(self.stage_timeout, left)
        return left > 0

    def setup_stage(self, grid, context, state) -> bool:
        """Key advertisement, within the round's deadline."""
        return self._left() and super().setup_stage(grid, context, state)

    def share_keys_stage(self, grid, context, state) -> bool:
        """Key shares, within the round's deadline."""
        return self._left() and super().share_keys_stage(grid, context, state)

    def collect_masked_vectors_stage(self, grid, context, state) -> bool:
        """Local training and the masked updates, within the round's deadline."""
        return self._left() and super().collect_masked_vectors_stage(grid, context, state)

    def unmask_stage(self, grid, context, state) -> bool:
        """Unmasking: what is left of the deadline, but never less than the floor."""
        self._left(FINAL_STAGE_FLOOR_SECONDS)
        return super().unmask_stage(grid, context, state)
