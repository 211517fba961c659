"""Flower's SecAgg+ workflow, stage by stage: a wait chosen before each stage, each stage
timed, the sites that sent no keys taken out of the round after the first, and (with
fedweave's masks) the masked vectors added up and unmasked in place, a part at a time
(``secagg_sum``; issue 36).

``SecAggPlusWorkflow``'s stage methods (``setup_stage`` ... ``unmask_stage``) have public
names and docstrings, but Flower 1.41 documents no way to extend them: overriding them relies
on how ``__call__`` runs them (in order, through ``self``, halting on ``False``), on each stage
reading ``self.timeout`` when it sends (its only wait), and on the fields of
``WorkflowState``, a dataclass Flower does not export. That is private coupling, so it lives
here, fingerprinted (``fingerprints``, entry ``secagg_stages``): a workflow refuses to be built
on Flower code that differs. The collect and unmask stages are Flower's, line for line, but
for their arithmetic, which ``secagg_sum`` does in place; ``tests/test_secagg_sum.py`` runs
both on the same state and compares the result byte for byte. What the waits are is
fedweave's own policy (``fedweave.coordinator.rounds.deadlines.DeadlineSecAggPlusWorkflow``:
one round deadline shared by the four stages); this module knows nothing of deadlines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import numpy as np
from flwr.common import Parameters
from flwr.server.workflow import SecAggPlusWorkflow

from fedweave.bulk.array_parts import UpdateSource
from fedweave.flower_patches.secagg_sum import (
    add_keystream,
    as_sum,
    masked_sum,
    streams,
    unmasked_tensors,
)
from fedweave.flower_patches.secagg_vectors import drop_vector, vector_in_reply

STAGES = ("setup", "share_keys", "collect_masked_vectors", "unmask")
"""SecAgg+'s four stages, in the order Flower runs them."""


def _workflow_module():
    """Flower's SecAgg+ workflow module: the names its stages use, as it imports them (some
    replaced by fedweave's: ``secagg_masks``, ``secagg_crypto``)."""
    import importlib

    return importlib.import_module("flwr.server.workflow.secure_aggregation.secaggplus_workflow")


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

    def __init__(self, *, model_shaped: bool = False, held_vectors: Any = None, **kwargs) -> None:
        problem = stages_problem()
        if problem is not None:
            from fedweave.errors import UserError

            raise UserError(problem)
        super().__init__(**kwargs)
        self.model_shaped = model_shaped
        """Whether the unmasked mean is handed on in the global model's shapes and dtypes
        (``model_layout``) instead of Flower's flat float64 (default False)."""
        self.held_vectors = held_vectors
        """Where the collect stage's masked vectors may be kept instead of in the replies
        (``collecting_vectors()``, ``vector_source(reply)``: the coordinator's transfer spool,
        ``SpooledUpdates``); None (default): in the replies."""
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
        """Local training and the masked updates, added up one site at a time where the masks
        are fedweave's (``secagg_sum``); otherwise Flower's stage, each site's vector put back
        where it reads it (it travels in an array record: ``secagg_vectors``)."""
        if streams(state.mod_range):
            held = self.held_vectors
            with held.collecting_vectors() if held is not None else nullcontext():
                return self._stage(
                    "collect_masked_vectors", self._collect_summed, grid, context, state
                )
        return self._stage(
            "collect_masked_vectors", super().collect_masked_vectors_stage,
            _VectorsWhereFlowerReadsThem(grid), context, state,
        )  # fmt: skip

    def masked_vector(self, reply) -> UpdateSource:
        """The masked vector of the collect stage's ``reply``, an array at a time (read from
        its file where it is held: ``held_vectors``)."""
        if self.held_vectors is not None:
            source = self.held_vectors.vector_source(reply)
            if source is not None:
                return source
        return vector_in_reply(reply)

    def _collect_summed(self, grid, context, state) -> bool:
        """Flower's ``collect_masked_vectors_stage``, each vector added into the sum and let
        go before the next is read (``secagg_sum.masked_sum``)."""
        flower = _workflow_module()
        key = flower.Key
        cfg = context.state.config_records[flower.MAIN_CONFIGS_RECORD]

        def make(nid: int):
            cfg_record = flower.ConfigRecord({
                key.STAGE: flower.Stage.COLLECT_MASKED_VECTORS,
                key.CIPHERTEXT_LIST: state.forward_ciphertexts[nid],
                key.SOURCE_LIST: state.forward_srcs[nid],
            })  # fmt: skip
            content = state.nid_to_fitins[nid]
            content.config_records[flower.RECORD_KEY_CONFIGS] = cfg_record
            return flower.Message(
                content=content,
                dst_node_id=nid,
                message_type=flower.MessageType.TRAIN,
                group_id=str(cfg[flower.WorkflowKey.CURRENT_ROUND]),
            )

        msgs = grid.send_and_receive(
            [make(node_id) for node_id in state.active_node_ids], timeout=self.timeout
        )
        state.active_node_ids = {msg.metadata.src_node_id for msg in msgs if not msg.has_error()}
        del state.forward_ciphertexts, state.forward_srcs, state.nid_to_fitins

        total = None
        for msg in msgs:
            if msg.has_error():
                state.failures.append(Exception(msg.error))
                continue
            vector = self.masked_vector(msg)
            try:
                total = masked_sum(total, vector)
            finally:
                vector.close()
                drop_vector(msg)
        if total is not None:
            state.aggregate_ndarrays = total  # modulo 2^32 already: Flower's parameters_mod

        for msg in msgs:  # Flower's: errors are counted again here
            if msg.has_error():
                state.failures.append(Exception(msg.error))
                continue
            fitres = flower.compat.recorddict_to_fitres(msg.content, True)
            proxy = state.nid_to_proxies[msg.metadata.src_node_id]
            state.legacy_results.append((proxy, fitres))
        return self._check_threshold(state)

    def unmask_stage(self, grid, context, state) -> bool:
        """Unmasking, in place and a part at a time where the masks are fedweave's
        (``secagg_sum``); otherwise Flower's stage."""
        if streams(state.mod_range):
            return self._stage("unmask", self._unmask_in_place, grid, context, state)
        return self._stage("unmask", super().unmask_stage, grid, context, state)

    def model_layout(self, context) -> list[tuple[tuple[int, ...], np.dtype]] | None:
        """The shapes and dtypes the unmasked mean is written in (``secagg_sum
        .unmasked_tensors``); ``None``: Flower's (the vector's shapes, float64). Those of the
        global model where ``model_shaped`` is set."""
        if not self.model_shaped:
            return None
        flower = _workflow_module()
        record = context.state.array_records.get(flower.MAIN_PARAMS_RECORD)
        if record is None or not len(record):
            return None
        from fedweave.bulk.records import BlobError, npy_array

        try:  # Flower's legacy records keep each array's .npy bytes, shape and dtype unset
            views = [npy_array(np.frombuffer(array.data, np.uint8)) for array in record.values()]
        except BlobError:
            return None
        return [(view.shape, view.dtype) for view in views]

    def _unmask_in_place(self, grid, context, state) -> bool:
        """Flower's ``unmask_stage``, the masks taken off the sum in place and the mean written
        a part at a time (``secagg_sum``)."""
        flower = _workflow_module()
        key = flower.Key
        cfg = context.state.config_records[flower.MAIN_CONFIGS_RECORD]
        current_round = cfg[flower.WorkflowKey.CURRENT_ROUND]

        active_nids = state.active_node_ids
        dead_nids = state.sampled_node_ids - active_nids

        def make(nid: int):
            neighbours = state.nid_to_neighbours[nid]
            cfg_record = flower.ConfigRecord({
                key.STAGE: flower.Stage.UNMASK,
                key.ACTIVE_NODE_ID_LIST: list(neighbours & active_nids),
                key.DEAD_NODE_ID_LIST: list(neighbours & dead_nids),
            })  # fmt: skip
            return flower.Message(
                content=flower.RecordDict({flower.RECORD_KEY_CONFIGS: cfg_record}),
                dst_node_id=nid,
                message_type=flower.MessageType.TRAIN,
                group_id=str(current_round),
            )

        msgs = grid.send_and_receive(
            [make(node_id) for node_id in state.active_node_ids], timeout=self.timeout
        )
        state.active_node_ids = {msg.metadata.src_node_id for msg in msgs if not msg.has_error()}

        collected_shares: dict[int, list[bytes]] = {nid: [] for nid in state.sampled_node_ids}
        for msg in msgs:
            if msg.has_error():
                state.failures.append(Exception(msg.error))
                continue
            res_dict = msg.content.config_records[flower.RECORD_KEY_CONFIGS]
            nids = res_dict[key.NODE_ID_LIST]
            shares = res_dict[key.SHARE_LIST]
            for owner_nid, share in zip(nids, shares, strict=True):
                collected_shares[owner_nid].append(share)

        vector = as_sum(state.aggregate_ndarrays)
        del state.aggregate_ndarrays
        for nid, share_list in collected_shares.items():
            if len(share_list) < state.threshold:
                flower.log(
                    flower.ERROR, "Not enough shares to recover secret in unmask vectors stage"
                )
                return False
            secret = flower.combine_shares(share_list)
            if nid in active_nids:  # the secret seeds the site's own (private) mask
                add_keystream(vector, secret, subtract=True)
                continue
            # the secret is a dropped site's key: the masks it shares with its neighbours
            neighbours = state.nid_to_neighbours[nid]
            neighbours.remove(nid)
            for neighbor_nid in neighbours:
                shared_key = flower.generate_shared_key(
                    flower.bytes_to_private_key(secret),
                    flower.bytes_to_public_key(state.nid_to_publickeys[neighbor_nid][0]),
                )
                add_keystream(vector, shared_key, subtract=nid < neighbor_nid)
        tensors = unmasked_tensors(
            vector,
            clipping_range=state.clipping_range,
            quantization_range=state.quantization_range,
            active_sites=len(active_nids),
            like=self.model_layout(context),
        )
        del vector

        results = state.legacy_results
        parameters = Parameters(tensors=tensors, tensor_type="numpy.ndarray")
        for _, fitres in results:
            fitres.parameters = parameters
        flower.log(
            flower.INFO,
            "aggregate_fit: received %s results and %s failures",
            len(results),
            len(state.failures),
        )
        parameters_aggregated, metrics_aggregated = context.strategy.aggregate_fit(
            current_round, results, state.failures
        )
        if parameters_aggregated:
            arr_record = flower.compat.parameters_to_arrayrecord(parameters_aggregated, True)
            context.state.array_records[flower.MAIN_PARAMS_RECORD] = arr_record
            context.history.add_metrics_distributed_fit(
                server_round=current_round, metrics=metrics_aggregated
            )
        return True
