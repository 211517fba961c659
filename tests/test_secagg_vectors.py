"""SecAgg+'s masked vector in an array record (``fedweave/flower_patches/secagg_vectors.py``,
issue 36), and a site's malformed vector failing that site instead of the round.

On the site's side, Flower's real ``secaggplus_mod`` output layout (its config record's list
of byte strings) is moved into the array record and back for Flower's collect stage, byte for
byte. On the coordinator's, ``OutcomeGrid`` (under it the stand-in grid of
``test_site_outcomes.py``) fails the site whose vector is missing or empty, that NumPy cannot
read as integers, or that is laid out otherwise than most sites' are. Real SecAgg+ rounds
through the new layout: ``test_secure_agg.py`` (the sum equals FedAvg's within
quantization; the coordinator never sees a site's plaintext) and every deployed SecAgg+ test.
"""

from __future__ import annotations

import io

import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.common import ndarray_to_bytes
from flwr.common.secure_aggregation.secaggplus_constants import Key, Stage
from test_site_outcomes import ROUND, _Grid, fit_result, instruction

from fedweave.contract import SITE_FAILED_CODE
from fedweave.coordinator.rounds.site_outcomes import (
    OutcomeGrid,
    SiteReplies,
    masked_vector_problems,
)
from fedweave.coordinator.rounds.traffic import payload_bytes
from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS
from fedweave.flower_patches.secagg_vectors import (
    MASKED_VECTOR_RECORD,
    masked_vector_layout,
    vector_as_arrays,
    vector_where_flower_reads_it,
)

MODEL_SIZE = 1000


def _vector(size: int = MODEL_SIZE, seed: int = 0) -> list[bytes]:
    """A masked vector as fedweave's masks lay it out: the weight factor, one flat vector."""
    rng = np.random.default_rng(seed)
    return [
        ndarray_to_bytes(np.array([123], dtype=np.int64)),
        ndarray_to_bytes(rng.integers(0, 2**32, size, dtype=np.uint32)),
    ]


def _collect(node: int) -> Message:
    """SecAgg+'s collect-stage instruction to ``node``, as Flower's workflow sends it."""
    message = instruction(node)
    message.content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord(
        {Key.STAGE: Stage.COLLECT_MASKED_VECTORS}
    )
    return message


ASKED = _collect(41)


def _collect_reply(datas: list | None) -> Message:
    """A collect-stage reply as Flower's ``secaggplus_mod`` returns it (``None``: without the
    vector's key), its vector moved by the site (``vector_as_arrays``)."""
    content = fit_result()
    content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord(
        {} if datas is None else {Key.MASKED_PARAMETERS: list(datas)}, False
    )
    return vector_as_arrays(Message(content, reply_to=ASKED))


def test_the_vector_travels_as_arrays_and_comes_back_byte_for_byte():
    datas = _vector()
    reply = _collect_reply(datas)
    config = reply.content.config_records[RECORD_KEY_CONFIGS]
    assert config[Key.MASKED_PARAMETERS] == []
    record = reply.content.array_records[MASKED_VECTOR_RECORD]
    assert [array.data for array in record.values()] == datas
    assert payload_bytes(reply.content) == sum(len(d) for d in datas)  # counted as before
    assert masked_vector_layout(reply, ASKED) == ((1,), (MODEL_SIZE,))

    back = vector_where_flower_reads_it(reply)
    assert back.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS] == datas
    assert MASKED_VECTOR_RECORD not in back.content.array_records
    assert masked_vector_layout(back, ASKED) == ((1,), (MODEL_SIZE,))  # read where Flower keeps it


def test_replies_of_other_stages_and_plain_rounds_are_left_alone():
    keys = Message(fit_result(), reply_to=instruction(41))
    keys.content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord({"pk1": b"k"})
    assert vector_as_arrays(keys) is keys and not keys.content.array_records.get(
        MASKED_VECTOR_RECORD
    )
    assert masked_vector_layout(keys, instruction(41)) is None  # not the collect stage
    plain = Message(fit_result(), reply_to=instruction(42))
    assert vector_as_arrays(plain) is plain
    assert masked_vector_layout(plain, instruction(42)) is None
    assert vector_where_flower_reads_it(plain) is plain


def test_a_vector_numpy_would_not_read_as_integers_is_named():
    factor, flat = _vector()
    floats = ndarray_to_bytes(np.zeros(MODEL_SIZE, dtype=np.float32))
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    objects = pickled.getvalue()  # what an insider could send: a pickle behind the header
    cases = {
        "truncated": ([factor, flat[:-4]], "bytes where its header says"),
        "floats": ([factor, floats], "dtype float32, not integers"),
        "objects": ([factor, objects], "not integers"),
        "garbage": ([factor, b"\x00" * 64], "not a NumPy array"),
        "empty": ([], "an empty masked vector"),
        "none": (None, "no masked vector"),
    }
    for name, (datas, problem) in cases.items():
        layout = masked_vector_layout(_collect_reply(datas), ASKED)
        assert isinstance(layout, str) and problem in layout, (name, layout)


def test_a_site_whose_vector_does_not_fit_fails_alone_and_the_others_go_on():
    """Five sites of a SecAgg+ collect stage: two honest, one with a vector one value short
    (Flower's sum would raise on it, halting everyone's round), one whose bytes NumPy cannot
    read, one with an empty vector (Flower's unmasking raised ``IndexError`` on it, ending the
    run). The three are failed with the reason, noted against their node; the honest replies
    reach the workflow with their vectors where Flower reads them."""
    answers = {
        41: _collect_reply(_vector(seed=1)).content,
        42: _collect_reply(_vector(MODEL_SIZE - 1, seed=2)).content,
        43: _collect_reply(_vector(seed=3)).content,
        44: _collect_reply([_vector()[0], b"\x93NUMPY"]).content,
        45: _collect_reply([]).content,
    }
    asked = [_collect(node) for node in answers]
    replies = SiteReplies()
    received = OutcomeGrid(_Grid(answers), replies).send_and_receive(asked)
    by_node = {reply.metadata.src_node_id: reply for reply in received}
    assert not by_node[41].has_error() and not by_node[43].has_error()
    assert replies.said(ROUND, 45).reason == "malformed reply: an empty masked vector"
    for node in (42, 44, 45):
        assert by_node[node].has_error() and by_node[node].error.code == SITE_FAILED_CODE
        assert replies.said(ROUND, node).status == "failed"
    assert "masked vector shaped ((1,), (999,)); most of the round's sites sent ((1,), " \
        "(1000,))" in replies.said(ROUND, 42).reason
    assert replies.said(ROUND, 44).reason.startswith("malformed reply: masked vector array 1")
    restored = vector_where_flower_reads_it(by_node[41])
    assert restored.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS] == (
        _vector(seed=1)
    )


def test_without_a_majority_layout_no_vector_joins():
    one = _collect_reply(_vector(seed=1))
    other = _collect_reply(_vector(MODEL_SIZE + 1, seed=2))
    problems = masked_vector_problems([(one, ASKED), (other, ASKED)])
    assert set(problems) == {id(one), id(other)}
    assert all("no layout is shared by most" in text for text in problems.values())
    assert masked_vector_problems([(one, ASKED)]) == {}


def test_a_collect_reply_flower_cannot_read_as_a_fit_result_fails_its_site_alone():
    """A well-formed vector in a reply without the rest of a fit result (Flower's collect
    stage reads its parameters, count, metrics and status, and raised ``KeyError`` on a reply
    without ``fitres.parameters``, ending the run, as a site's transfer mod once sent): the
    site is failed with what is missing, the others' vectors join."""
    without = {}
    for node, (records, name) in zip((51, 52, 53), (
        ("array_records", "fitres.parameters"), ("metric_records", "fitres.num_examples"),
        ("config_records", "fitres.status"),
    )):  # fmt: skip
        content = _collect_reply(_vector(seed=node)).content
        del getattr(content, records)[name]
        without[node] = (content, name)
    bad_metrics = _collect_reply(_vector(seed=54)).content
    bad_metrics.config_records["fitres.metrics"]["m"] = [b"not", b"a scalar"]
    answers = {node: content for node, (content, _) in without.items()}
    answers |= {54: bad_metrics, 55: _collect_reply(_vector(seed=5)).content,
                56: _collect_reply(_vector(seed=6)).content}  # fmt: skip
    replies = SiteReplies()
    received = OutcomeGrid(_Grid(answers), replies).send_and_receive(
        [_collect(node) for node in answers]
    )
    by_node = {reply.metadata.src_node_id: reply for reply in received}
    for node, (_, name) in without.items():
        assert by_node[node].has_error(), node
        assert replies.said(ROUND, node).reason.startswith(f"malformed reply: no {name}")
    assert by_node[54].has_error()
    assert "a fit result Flower cannot read" in replies.said(ROUND, 54).reason
    assert not by_node[55].has_error() and not by_node[56].has_error()
