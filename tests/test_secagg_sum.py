"""SecAgg+'s sum and unmasking in place, a part at a time (``fedweave/flower_patches/
secagg_sum.py``, issue 36), against Flower's own stages on the same inputs.

Each stage test builds Flower's ``WorkflowState`` as the stage before it leaves it, runs
Flower 1.41's ``collect_masked_vectors_stage`` / ``unmask_stage`` on one copy and
``StagedSecAggPlusWorkflow``'s on another, with fedweave's masks and share scheme installed as
in every run, and parts of a few values so that every part boundary is crossed. Real rounds
through these stages: ``test_secure_agg.py`` (simulated, a site dropping out in the masked
stage) and every deployed SecAgg+ test.
"""

from __future__ import annotations

import copy
import importlib

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.common import (
    Code,
    FitRes,
    Parameters,
    Status,
    ndarray_to_bytes,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.ndarrays_arithmetic import (
    parameters_addition,
    parameters_mod,
)
from flwr.common.secure_aggregation.secaggplus_constants import Key
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WfKey
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState
from test_site_outcomes import _Grid

from fedweave.bulk.array_parts import UpdateInMemory
from fedweave.flower_patches import secagg_sum, use_fedweave_secagg
from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS
from fedweave.flower_patches.secagg_masks import keystream_uint32, unflatten
from fedweave.flower_patches.secagg_stages import StagedSecAggPlusWorkflow
from fedweave.flower_patches.secagg_vectors import MASKED_VECTOR_RECORD

SITE_MOD = "flwr.client.mod.secure_aggregation.secaggplus_mod"
WORKFLOW = "flwr.server.workflow.secure_aggregation.secaggplus_workflow"
MODEL = [((3, 5), np.float32), ((7,), np.float32), ((), np.float32), ((2, 2), np.float64)]
"""The global model's shapes and dtypes: 27 values, a 0-d array among them."""
SIZE = 27


@pytest.fixture(autouse=True)
def fedweave_secagg(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity

    use_fedweave_secagg()
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)  # as in a ServerApp: its messages carry them
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    monkeypatch.setattr(secagg_sum, "SUM_CHUNK", 5)  # parts of 5 values: every edge crossed


def test_a_keystream_part_is_the_keystream_from_its_place():
    seed = b"s" * 32
    whole = keystream_uint32(seed, 70)
    for start in (0, 1, 3, 4, 5, 17, 64):
        for count in (0, 1, 4, 6):
            assert np.array_equal(secagg_sum.keystream_part(seed, start, count),
                                  whole[start : start + count]), (start, count)  # fmt: skip
    far = 10**6 + 3  # counter blocks past the first 2^16 values, across a block boundary
    assert np.array_equal(secagg_sum.keystream_part(seed, far, 9),
                          keystream_uint32(seed, far + 9)[far:])  # fmt: skip


def _vector(rng, factor: int, size: int = SIZE, dtype=np.uint32) -> list[np.ndarray]:
    """A masked vector as a site's ``secaggplus_mod`` makes it with fedweave's masks."""
    return [np.array([factor], dtype=np.int64), rng.integers(0, 2**32, size).astype(dtype)]


def test_the_sum_is_flowers_sum_modulo_two_to_the_32():
    rng = np.random.default_rng(0)
    vectors = [_vector(rng, 2**31 + n) for n in range(3)]
    vectors.append([np.array([-5], np.int64), rng.integers(-(2**40), 2**40, SIZE)])  # int64
    expected = vectors[0]
    for vector in vectors[1:]:
        expected = parameters_addition(expected, vector)
    expected = parameters_mod(expected, 2**32)
    total = None
    for vector in vectors:
        total = secagg_sum.masked_sum(total, UpdateInMemory(vector))
    assert [array.dtype for array in total] == [np.uint32, np.uint32]
    assert all(np.array_equal(t, e) for t, e in zip(total, expected))
    with pytest.raises(ValueError, match="cannot be added"):
        secagg_sum.masked_sum(total, UpdateInMemory(_vector(rng, 1, SIZE - 1)))
    with pytest.raises(ValueError, match="not integers"):
        secagg_sum.masked_sum(total, UpdateInMemory([np.ones(1), np.ones(SIZE)]))


class _Strategy:
    """Keeps what the unmasking stage hands the strategy."""

    def __init__(self) -> None:
        self.results = None

    def aggregate_fit(self, server_round, results, failures):
        self.results = results
        return results[0][1].parameters, {}


class _History:
    def add_metrics_distributed_fit(self, server_round, metrics):
        pass


class _Context:
    def __init__(self) -> None:
        self.state = RecordDict()
        self.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WfKey.CURRENT_ROUND: 3})
        model = ndarrays_to_parameters([np.zeros(shape, dtype) for shape, dtype in MODEL])
        compat = importlib.import_module(WORKFLOW).compat  # the global model as Flower keeps it
        self.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
            model, keep_input=True
        )
        self.strategy = _Strategy()
        self.history = _History()


def _res(num_examples: int = 10) -> FitRes:
    return FitRes(Status(Code.OK, "Success"), Parameters([], "numpy.ndarray"), num_examples, {})


def _unmask_round(dropped: bool):
    """Sites 1-4 (site 4 dropped out in the masked stage where ``dropped``), each site's
    secrets shared among all four with fedweave's scheme, and the masked sum the collect
    stage left: the survivors' private masks and the dropped site's pairwise masks are taken
    off it by the unmasking. Returns Flower's state and the grid answering its shares."""
    site = importlib.import_module(SITE_MOD)
    rng = np.random.default_rng(1)
    nodes, threshold = [1, 2, 3, 4], 3
    keys = {nid: site.generate_key_pairs() for nid in nodes}
    secrets = {
        nid: site.private_key_to_bytes(keys[nid][0]) if (dropped and nid == 4) else
        rng.bytes(32)
        for nid in nodes
    }  # fmt: skip
    shares = {nid: site.create_shares(secrets[nid], threshold, len(nodes)) for nid in nodes}
    active = {1, 2, 3} if dropped else set(nodes)
    state = WorkflowState(
        sampled_node_ids=set(nodes),
        active_node_ids=set(active),
        threshold=threshold,
        clipping_range=8.0,
        quantization_range=2**22,
        mod_range=2**32,
        nid_to_neighbours={nid: set(nodes) for nid in nodes},  # Flower: a site among its own
        nid_to_publickeys={
            nid: [site.public_key_to_bytes(keys[nid][1]), b"unused"] for nid in nodes
        },
        aggregate_ndarrays=_vector(rng, 3 * 2**20),
        legacy_results=[(None, _res()) for _ in active],
    )
    answers = {}
    for index, nid in enumerate(nodes):
        answers[nid] = RecordDict({RECORD_KEY_CONFIGS: ConfigRecord({
            Key.NODE_ID_LIST: nodes,
            Key.SHARE_LIST: [shares[owner][index] for owner in nodes],
        })})  # fmt: skip
    return state, _Grid(answers)


@pytest.mark.parametrize("dropped", [False, True], ids=["all-active", "one-dropped"])
def test_unmasking_in_place_gives_flowers_mean_byte_for_byte(dropped):
    state, grid = _unmask_round(dropped)
    workflow = StagedSecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=3, timeout=30.0)

    flower, ours, shaped = _Context(), _Context(), _Context()
    assert SecAggPlusWorkflow.unmask_stage(workflow, grid, flower, copy.deepcopy(state))
    assert workflow.unmask_stage(grid, ours, copy.deepcopy(state))
    expected = flower.strategy.results[0][1].parameters
    assert ours.strategy.results[0][1].parameters.tensors == expected.tensors
    assert len(ours.strategy.results) == len(state.legacy_results)

    workflow.model_shaped = True  # what the reporting strategy made of Flower's layout
    assert workflow.unmask_stage(grid, shaped, copy.deepcopy(state))
    like = [np.zeros(shape, dtype) for shape, dtype in MODEL]
    folded = unflatten(parameters_to_ndarrays(expected), like)
    got = parameters_to_ndarrays(shaped.strategy.results[0][1].parameters)
    assert [(a.shape, a.dtype) for a in got] == [(a.shape, a.dtype) for a in like]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, folded))


@pytest.mark.parametrize("like", [None, [((100, 150), np.float32), ((5003,), np.float64)]],
                         ids=["flowers-layout", "model-shaped"])  # fmt: skip
def test_the_mean_is_written_as_the_sum_gives_its_memory_back(monkeypatch, like):
    monkeypatch.setattr(secagg_sum, "SUM_CHUNK", 3000)  # parts of 12 KB: whole pages in each
    rng = np.random.default_rng(4)
    vectors = [_vector(rng, 2**20 + n, 20_003) for n in range(2)]
    summed = secagg_sum.masked_sum(None, UpdateInMemory(vectors[0]))
    summed = secagg_sum.masked_sum(summed, UpdateInMemory(vectors[1]))
    plain = [np.array(array) for array in summed]  # the same values in ordinary memory
    options = dict(clipping_range=8.0, quantization_range=2**22, active_sites=2, like=like)

    expected = secagg_sum.unmasked_tensors(plain, **options)
    assert secagg_sum.unmasked_tensors(summed, **options) == expected
    assert np.count_nonzero(plain[1]) > 19_000  # an ordinary array is left as it was
    # the sum's pages went back to the system as the mean was written: they read as zeros,
    # but for the page that two parts share at each of the 6 boundaries and the last one
    assert np.count_nonzero(summed[1]) <= 7 * 1024


def test_too_few_shares_halts_the_unmasking_as_flowers_does():
    state, grid = _unmask_round(dropped=True)
    state.threshold = 5  # more shares than there are sites
    workflow = StagedSecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=3, timeout=30.0)
    assert (
        SecAggPlusWorkflow.unmask_stage(workflow, grid, _Context(), copy.deepcopy(state)) is False
    )
    assert workflow.unmask_stage(grid, _Context(), copy.deepcopy(state)) is False


def _collect_state(nodes) -> WorkflowState:
    return WorkflowState(
        sampled_node_ids=set(nodes),
        active_node_ids=set(nodes),
        mod_range=2**32,
        threshold=2,
        forward_ciphertexts={nid: [] for nid in nodes},
        forward_srcs={nid: [] for nid in nodes},
        nid_to_fitins={nid: RecordDict() for nid in nodes},
        nid_to_proxies={nid: f"proxy{nid}" for nid in nodes},
        nid_to_neighbours={nid: set(nodes) for nid in nodes},
    )


def _collect_answer(vector: list[np.ndarray] | None, in_arrays: bool) -> RecordDict:
    """A site's collect-stage reply: its fit result, its masked vector in the array record it
    travels in (``in_arrays``) or where Flower's ``secaggplus_mod`` puts it."""
    from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS as CONFIGS

    workflow = importlib.import_module(WORKFLOW)
    content = workflow.compat.fitres_to_recorddict(_res(), keep_input=True)
    datas = [ndarray_to_bytes(array) for array in vector]
    if in_arrays:
        from flwr.app import Array

        content.config_records[CONFIGS] = ConfigRecord({Key.MASKED_PARAMETERS: []})
        content.array_records[MASKED_VECTOR_RECORD] = ArrayRecord(array_dict={
            str(i): Array(dtype="", shape=(), stype="numpy.ndarray", data=data)
            for i, data in enumerate(datas)
        })  # fmt: skip
    else:
        content.config_records[CONFIGS] = ConfigRecord({Key.MASKED_PARAMETERS: datas})
    return content


def test_collecting_adds_each_vector_and_lets_it_go_as_flowers_sum_would():
    rng = np.random.default_rng(2)
    vectors = {nid: _vector(rng, 2**31 + nid) for nid in (1, 2, 3)}
    answers = {1: _collect_answer(vectors[1], True), 2: _collect_answer(vectors[2], False),
               3: _collect_answer(vectors[3], True), 4: None}  # fmt: skip
    workflow = StagedSecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=2, timeout=30.0)
    theirs, ours = _collect_state([1, 2, 3, 4]), _collect_state([1, 2, 3, 4])
    from fedweave.flower_patches.secagg_stages import _VectorsWhereFlowerReadsThem

    flower_grid = _VectorsWhereFlowerReadsThem(_Grid(copy.deepcopy(answers)))
    assert SecAggPlusWorkflow.collect_masked_vectors_stage(
        workflow, flower_grid, _Context(), theirs
    )
    replies = []

    class _Kept(_Grid):
        def send_and_receive(self, messages, *, timeout=None):
            replies.extend(super().send_and_receive(messages, timeout=timeout))
            return replies

    assert workflow.collect_masked_vectors_stage(_Kept(answers), _Context(), ours)
    assert ours.active_node_ids == theirs.active_node_ids == {1, 2, 3}
    assert [a.tobytes() for a in ours.aggregate_ndarrays] == [
        a.astype(np.uint32).tobytes() for a in theirs.aggregate_ndarrays
    ]
    assert [p for p, _ in ours.legacy_results] == [p for p, _ in theirs.legacy_results]
    assert not hasattr(ours, "nid_to_fitins") or not ours.nid_to_fitins
    for reply in replies:  # each vector let go once added
        assert MASKED_VECTOR_RECORD not in reply.content.array_records
        assert reply.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS] == []
