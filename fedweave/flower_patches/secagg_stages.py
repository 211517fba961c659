"""Flower's SecAgg+ workflow, stage by stage: a wait chosen before each stage, each stage
timed, and the sites that sent no keys taken out of the round after the first.

``SecAggPlusWorkflow``'s stage methods (``setup_stage`` ... ``unmask_stage``) have public
names and docstrings, but Flower 1.41 documents no way to extend them: overriding them relies
on how ``__call__`` runs them (in order, through ``self``, halting on ``False``), on each stage
reading ``self.timeout`` when it sends (its only wait), and on the fields of
``WorkflowState``, a dataclass Flower does not export. That is private coupling, so it lives
here, fingerprinted (``fingerprints``, entry ``secagg_stages``): a workflow refuses to be built
on Flower code that differs. What the waits are is fedweave's own policy
(``fedweave.coordinator.rounds.deadlines.DeadlineSecAggPlusWorkflow``: one round deadline shared by
the four stages); this module knows nothing of deadlines.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from flwr.server.workflow import SecAggPlusWorkflow

STAGES = ("setup", "share_keys", "collect_masked_vectors", "unmask")
"""SecAgg+'s four stages, in the order Flower runs them."""


def forget_sites_without_keys(state) -> None:
    """Take the sites that did not answer SecAgg+'s key advertisement, or did not send their
    key shares, out of the round.

    Flower 1.41 keeps them among the round's sampled sites, so its unmasking stage lists them
    as dropped and asks the others for their key shares, which the others never received (a
    site that advertised no keys got none; one silent in the share stage sent none): every
    surviving site's ClientApp then fails with a ``KeyError`` and the whole round halts. A
    site masks only with the sites whose shares it received, so such a site shares no mask
    with anyone, the protocol is unchanged by forgetting it, and the round goes on with the
    others.
    """
    silent = set(state.sampled_node_ids) - set(state.active_node_ids)
    if not silent:
        return
    state.sampled_node_ids -= silent
    for node_id in silent:
        state.nid_to_neighbours.pop(node_id, None)
    for neighbours in state.nid_to_neighbours.values():
        neighbours -= silent


def stages_problem() -> str | None:
    """Why Flower's SecAgg+ workflow cannot be run stage by stage here, or None."""
    from fedweave.flower_patches import correctness_problem

    return correctness_problem(
        "secagg_stages",
        why="fedweave runs SecAgg+ stage by stage to hold every round to its deadline",
    )


class _VectorsWhereFlowerReadsThem:
    """A grid whose replies carry their masked vector where Flower's collect stage reads it
    (``secagg_vectors.vector_where_flower_reads_it``); everything else is the wrapped grid's."""

    def __init__(self, grid) -> None:
        self._grid = grid

    def send_and_receive(self, messages, *, timeout: float | None = None):
        from fedweave.flower_patches.secagg_vectors import vector_where_flower_reads_it

        replies = self._grid.send_and_receive(messages, timeout=timeout)
        return [vector_where_flower_reads_it(reply) for reply in replies]

    def __getattr__(self, name: str):
        return getattr(self._grid, name)


class StagedSecAggPlusWorkflow(SecAggPlusWorkflow):
    """Flower's SecAgg+ workflow asking ``stage_wait(name)`` before each stage how long that
    stage may wait for replies (``None``: halt the round there), timing each stage
    (``stage_seconds``), and forgetting the sites without keys after ``setup`` and the sites
    that sent no key shares after ``share_keys``.

    ``SecAggPlusWorkflow``'s own ``timeout`` is kept as ``stage_timeout`` (the longest any one
    stage waits); ``begin_round`` and ``end_round`` run around each round. Raises
    ``fedweave.errors.UserError`` on Flower code this was not written against.
    """

    def __init__(self, **kwargs) -> None:
        problem = stages_problem()
        if problem is not None:
            from fedweave.errors import UserError

            raise UserError(problem)
        super().__init__(**kwargs)
        self.stage_timeout = self.timeout
        self.stage_seconds: dict[str, float] = {}
        """Wall seconds of each stage of the last round, by name in ``STAGES``."""

    def stage_wait(self, name: str) -> float | None:
        """Seconds stage ``name`` may wait for replies; ``None`` halts the round before it."""
        return self.stage_timeout

    def begin_round(self) -> None:
        """Called as each round starts."""

    def end_round(self) -> None:
        """Called as each round ends (completed, halted or failed)."""

    def __call__(self, grid, context) -> None:
        self.stage_seconds = {}
        self.begin_round()
        try:
            super().__call__(grid, context)
        finally:
            self.end_round()

    def _stage(self, name: str, stage: Callable[..., bool], grid, context, state) -> bool:
        wait = self.stage_wait(name)
        if wait is None:
            return False
        self.timeout = wait  # each of Flower's stages waits self.timeout for its replies
        started = time.perf_counter()
        try:
            return stage(grid, context, state)
        finally:
            self.stage_seconds[name] = time.perf_counter() - started

    def setup_stage(self, grid, context, state) -> bool:
        """Key advertisement; a site that sent no keys is then out of the round."""
        enough = self._stage("setup", super().setup_stage, grid, context, state)
        if "setup" in self.stage_seconds:  # it ran (not halted before it)
            forget_sites_without_keys(state)
        return enough

    def share_keys_stage(self, grid, context, state) -> bool:
        """Key shares; a site that sent none is then out of the round."""
        enough = self._stage("share_keys", super().share_keys_stage, grid, context, state)
        if "share_keys" in self.stage_seconds:
            forget_sites_without_keys(state)
        return enough

    def collect_masked_vectors_stage(self, grid, context, state) -> bool:
        """Local training and the masked updates (each site's vector travels in an array
        record: ``secagg_vectors``; put back where Flower's stage reads it)."""
        return self._stage(
            "collect_masked_vectors", super().collect_masked_vectors_stage,
            _VectorsWhereFlowerReadsThem(grid), context, state,
        )  # fmt: skip

    def unmask_stage(self, grid, context, state) -> bool:
        """Unmasking."""
        return self._stage("unmask", super().unmask_stage, grid, context, state)
