"""Compressed updates (``--compress``, issue 24) and the bytes the history records.

The codec at both ends (``fedweave/learning/compression.py``), its error feedback, the
site's mod on Flower's real ``Message`` and ``Context`` (``client/compression_mod.py``), the
coordinator's decoding and rejection of an update in another format, the refusals, and real
simulations whose history holds each site's uplink bytes and each round's bytes in and out.
Bytes and accuracy against ``none`` are measured by ``bench/bench_compression.py``.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Context, Message, Metadata, RecordDict
from flwr.app.message_type import MessageType
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Status,
    ndarray_to_bytes,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server.strategy import FedAvg

from fedweave.client.compression_mod import RESIDUAL_RECORD, compression_when_asked
from fedweave.contract import COMPRESS_KEY, COMPRESSION_METRIC, UPLINK_BYTES_METRIC
from fedweave.coordinator.rounds.reporting import ReportingStrategy
from fedweave.errors import UserError
from fedweave.learning.compression import Compression, CompressionMismatch, top_k_count

LOSSY = ("fp16", "int8", "topk:0.1")


def _model(seed: int = 0) -> list[np.ndarray]:
    """A small model's state: two weight tensors, a bias and an integer counter (BatchNorm's
    ``num_batches_tracked`` is one), which travels exactly."""
    rng = np.random.default_rng(seed)
    return [
        rng.normal(size=(20, 8)).astype(np.float32), rng.normal(size=8).astype(np.float32),
        rng.normal(size=(8, 3)).astype(np.float32), np.array(7, dtype=np.int64),
    ]  # fmt: skip


def _trained(reference: list[np.ndarray], seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    local = [r + rng.normal(scale=0.01, size=r.shape).astype(np.float32) for r in reference[:3]]
    return [*local, np.array(9, dtype=np.int64)]


@pytest.mark.parametrize(
    "spec, problem",
    [
        ("int4", "is not a compression"), ("topk", "not a number"), ("topk:0", "in (0, 1]"),
        ("topk:1.5", "in (0, 1]"), ("topk:x", "not a number"), ("fp16:2", "takes no value"),
        ("topk:nan", "in (0, 1]"),
    ],
)  # fmt: skip
def test_a_compression_that_does_not_parse_is_one_line_naming_the_forms(spec, problem):
    with pytest.raises(UserError) as caught:
        Compression.parse(spec)
    text = str(caught.value)
    assert problem in text and "none, fp16, int8 or topk:F" in text and "\n" not in text


def test_the_specs_that_parse():
    assert Compression.parse("none") == Compression() and not Compression().active
    assert Compression.parse(" topk:0.25 ").spec == "topk:0.25"
    assert Compression.parse("topk:1").fraction == 1.0
    assert [Compression.parse(k).spec for k in ("fp16", "int8")] == ["fp16", "int8"]


@pytest.mark.parametrize("spec", LOSSY)
def test_each_lossy_kind_decodes_to_the_model_up_to_what_it_kept(spec):
    """The coordinator's decoded model plus the error the site kept is the site's model, to
    float32 rounding: compression delays what it drops, it never loses it."""
    compression = Compression.parse(spec)
    reference = _model()
    local = _trained(reference)
    sent, kept = compression.encode(local, reference, None)
    decoded = compression.decode(sent, reference)
    flat = np.concatenate([(d - r).reshape(-1) for d, r in zip(decoded[:3], reference[:3])])
    wanted = np.concatenate([(x - r).reshape(-1) for x, r in zip(local[:3], reference[:3])])
    np.testing.assert_allclose(flat + kept, wanted, atol=1e-6)
    assert decoded[3] == 9 and decoded[3].dtype == np.int64  # the counter, exactly
    assert all(d.dtype == r.dtype and d.shape == r.shape for d, r in zip(decoded, reference))
    size = sum(a.nbytes for a in sent)
    full = sum(a.nbytes for a in local)
    expected = {"fp16": 2 * 192 + 8, "int8": 192 + 3 * 4 + 8,
                "topk:0.1": 8 * top_k_count(0.1, 192) + 8}[spec]  # fmt: skip
    assert size == expected and size < full / 1.9


def test_int8_rounds_each_value_to_its_tensors_scale_and_top_k_sends_the_largest():
    reference = _model()
    local = _trained(reference)
    sent, kept = Compression.parse("int8").encode(local, reference, None)
    scales = sent[1]
    update = (local[0] - reference[0]).reshape(-1)
    assert scales[0] == pytest.approx(np.abs(update).max() / 127)
    assert np.abs(kept[: update.size]).max() <= scales[0] / 2 + 1e-7
    positions, values = Compression.parse("topk:0.1").encode(local, reference, None)[0][:2]
    whole = np.concatenate([(x - r).reshape(-1) for x, r in zip(local[:3], reference[:3])])
    assert positions.size == 20 and set(positions) == set(np.argsort(-np.abs(whole))[:20])
    np.testing.assert_array_equal(values, whole[positions])


def test_error_feedback_sends_over_rounds_what_one_round_drops():
    """The same update five times under top-k 10%: what the coordinator has added up plus
    what the site still keeps is exactly five updates, and the kept error stays bounded (it
    does not grow with the rounds)."""
    compression = Compression.parse("topk:0.1")
    reference = _model()
    local = _trained(reference)
    kept, total = None, np.zeros(192, np.float32)
    norms = []
    for _ in range(5):
        sent, kept = compression.encode(local, reference, kept)
        decoded = compression.decode(sent, reference)
        total += np.concatenate([(d - r).reshape(-1) for d, r in zip(decoded[:3], reference[:3])])
        norms.append(float(np.linalg.norm(kept)))
    once = np.concatenate([(x - r).reshape(-1) for x, r in zip(local[:3], reference[:3])])
    np.testing.assert_allclose(total + kept, 5 * once, atol=1e-5)
    assert norms[-1] < 5 * np.linalg.norm(once) * 0.9


@pytest.mark.parametrize(
    "spec, tamper, problem",
    [
        ("int8", lambda s: s[:1] + s[2:], "arrays, but int8 of this model is 3"),
        ("int8", lambda s: [s[0].astype(np.int16), *s[1:]], "array 1 is int16[192]"),
        ("int8", lambda s: [np.full(192, -128, np.int8), *s[1:]], "int8 levels outside"),
        ("fp16", lambda s: [s[0].astype(np.float32), *s[1:]], "array 1 is float32[192]"),
        ("topk:0.1", lambda s: [s[0][::-1].copy(), *s[1:]], "not strictly increasing"),
        ("topk:0.1", lambda s: [np.full_like(s[0], 1000), *s[1:]], "out of range"),
        ("topk:0.1", lambda s: [s[0][:5], s[1][:5], s[2]], "array 1 is uint32[5]"),
        ("fp16", lambda s: [s[0], s[1].astype(np.int32)], "tensor 3 is int32[]"),
    ],
)  # fmt: skip
def test_an_update_not_in_the_agreed_format_is_refused_with_what_differs(spec, tamper, problem):
    compression = Compression.parse(spec)
    reference = _model()
    sent, _ = compression.encode(_trained(reference), reference, None)
    with pytest.raises(CompressionMismatch, match=problem.replace("[", r"\[")):
        compression.decode(tamper(sent), reference)


def _fit_message(reference: list[np.ndarray], spec: str) -> Message:
    content = compat.fitins_to_recorddict(
        FitIns(ndarrays_to_parameters(reference), {"round": 1, COMPRESS_KEY: spec}),
        keep_input=True,
    )  # fmt: skip
    metadata = Metadata(
        run_id=1, message_id="m1", src_node_id=0, dst_node_id=5, reply_to_message_id="",
        group_id="1", created_at=0.0, ttl=60.0, message_type=MessageType.TRAIN,
    )  # fmt: skip
    return Message(content=content, metadata=metadata)


def test_the_site_mod_compresses_its_update_and_keeps_the_error_in_the_run_state():
    """Flower's real Message and Context: the reply carries the compressed update and says
    its format; the dropped error is in ``context.state`` and added to the next update."""
    reference = _model()
    local = _trained(reference)
    context = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    message = _fit_message(reference, "topk:0.1")

    def app(msg, ctx):
        res = FitRes(Status(Code.OK, "ok"), ndarrays_to_parameters(local), 12, {"train_loss": 1.0})
        return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=msg)

    first = compat.recorddict_to_fitres(compression_when_asked(message, context, app).content,
                                        keep_input=True)  # fmt: skip
    assert first.metrics[COMPRESSION_METRIC] == "topk:0.1" and first.num_examples == 12
    sent = parameters_to_ndarrays(first.parameters)
    assert [a.dtype for a in sent] == [np.uint32, np.float32, np.int64]
    kept = context.state.array_records[RESIDUAL_RECORD].to_numpy_ndarrays()[0]
    assert kept.shape == (192,) and np.count_nonzero(kept) == 192 - 20
    second = compat.recorddict_to_fitres(compression_when_asked(message, context, app).content,
                                         keep_input=True)  # fmt: skip
    expected, _ = Compression.parse("topk:0.1").encode(local, reference, kept)
    for got, want in zip(parameters_to_ndarrays(second.parameters), expected):
        np.testing.assert_array_equal(got, want)


def test_the_site_mod_leaves_rounds_without_compression_alone():
    reference = _model()
    context = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    message = _fit_message(reference, "")
    reply = Message(RecordDict(), reply_to=message)
    assert compression_when_asked(message, context, lambda m, c: reply) is reply


def _reply(weights: list[np.ndarray], metrics: dict) -> FitRes:
    return FitRes(Status(Code.OK, "ok"), ndarrays_to_parameters(weights), 10, metrics)


def test_the_coordinator_decodes_agreed_updates_and_rejects_others_with_the_reason():
    """Four sites: one in the agreed format (decoded to its model), one that sent its model
    uncompressed (an older site), one in another compression, one whose arrays do not fit
    the model; the last three are recorded rejected with what differs."""
    reference = _model()
    local = _trained(reference)
    compression = Compression.parse("int8")
    sent, _ = compression.encode(local, reference, None)
    reporting = ReportingStrategy(FedAvg(), evaluator=None, compression=compression)
    reporting._global = reference
    results = [
        (SimpleNamespace(node_id=1), _reply(sent, {COMPRESSION_METRIC: "int8"})),
        (SimpleNamespace(node_id=2), _reply(local, {})),
        (SimpleNamespace(node_id=3), _reply(sent, {COMPRESSION_METRIC: "fp16"})),
        (SimpleNamespace(node_id=4), _reply(sent[:1], {COMPRESSION_METRIC: "int8"})),
    ]
    accepted = reporting._check_each_update(results)
    assert [proxy.node_id for proxy, _ in accepted] == [1]
    decoded = parameters_to_ndarrays(accepted[0][1].parameters)
    for got, want in zip(decoded[:3], local[:3]):
        np.testing.assert_allclose(got, want, atol=0.001)
    recorded = {int(s.site_id): (s.status, s.reason) for s in reporting._sites}
    assert recorded[1] == ("ok", None)
    assert recorded[2] == (
        "rejected", "update sent uncompressed, but the run agreed --compress int8",
    )  # fmt: skip
    assert recorded[3] == (
        "rejected", "update sent compressed as fp16, but the run agreed --compress int8",
    )  # fmt: skip
    assert recorded[4][0] == "rejected" and "int8 of this model is 3" in recorded[4][1]


@pytest.mark.parametrize(
    "flags, problem",
    [
        (["--compress", "topk:2"], "the top-k fraction must be in (0, 1]"),
        (["--compress", "int8"], "under SecAgg+ sites send masked integers"),
        (["--compress", "int8", "--no-secure-agg", "--dp", "central"], "central DP clips"),
    ],
)  # fmt: skip
def test_impossible_compression_is_one_line_and_exit_2_before_anything_starts(
    tmp_path, flags, problem
):
    done = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", "simulate", "--task", "digits", "--clients", "3",
         "--rounds", "1", "--db", "none", "--out", str(tmp_path / "r"), *flags],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and problem in lines[0] and "Traceback" not in done.stderr


def _simulate(tmp_path, *flags: str, rounds: int = 3) -> list[dict]:
    from fedweave.history import open_store

    tmp_path.mkdir(exist_ok=True)
    db = f"sqlite:///{tmp_path / 'h.db'}"
    done = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", "simulate", "--task", "digits", "--clients", "3",
         "--rounds", str(rounds), "--db", db, "--out", str(tmp_path / "r"),
         "--checkpoint-dir", str(tmp_path / "ck"), *flags],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with open_store(db) as store:
        run_id = store.list_runs()[0].run_id
        return [store.rounds(run_id), store.site_results(run_id)]


def test_a_compressed_simulation_learns_and_records_each_sites_uplink_bytes(tmp_path):
    """Real simulations of the same seed: uncompressed, every site's uplink is the model's
    bytes; with top-k 10% it is what the codec sends (positions and values of 10% of the
    floating values), as Flower serialises arrays (a 128-byte header each); each round
    records its bytes in and out, and the run still learns."""
    from fedweave.learning.tasks import load_task
    from fedweave.learning.weights import get_weights

    weights = get_weights(load_task("digits").build_model())
    model_bytes = sum(len(ndarray_to_bytes(w)) for w in weights)  # as Flower serialises them
    sent, _ = Compression.parse("topk:0.1").encode(weights, weights, None)
    topk_bytes = sum(len(ndarray_to_bytes(a)) for a in sent)
    assert topk_bytes < model_bytes / 4
    plain_rounds, plain_sites = _simulate(tmp_path / "plain", "--no-secure-agg")
    rounds, sites = _simulate(tmp_path / "topk", "--no-secure-agg", "--compress", "topk:0.1")
    assert {s["metrics"][UPLINK_BYTES_METRIC] for s in plain_sites} == {model_bytes}
    assert {s["metrics"][UPLINK_BYTES_METRIC] for s in sites} == {topk_bytes}
    assert all(s["metrics"][COMPRESSION_METRIC] == "topk:0.1" for s in sites)
    for row in rounds:
        # training replies, plus evaluation replies with no arrays; the model goes to 3 sites
        # to train and 3 to evaluate
        assert row["bytes_in"] == 3 * topk_bytes
        assert row["bytes_out"] >= 6 * model_bytes
    assert rounds[-1]["eval_accuracy"] > 0.6
    assert plain_rounds[-1]["bytes_in"] == 3 * model_bytes


def test_secure_aggregation_rounds_record_the_bytes_each_site_sent(tmp_path):
    """Under SecAgg+ (the default) a site's uplink is its keys, shares and masked vector,
    counted as they arrived in the four stages: more than the model's own bytes."""
    from fedweave.learning.tasks import load_task
    from fedweave.learning.weights import get_weights

    weights = get_weights(load_task("digits").build_model())
    model_bytes = sum(len(ndarray_to_bytes(w)) for w in weights)
    rounds, sites = _simulate(tmp_path, rounds=2)
    uplinks = [s["metrics"][UPLINK_BYTES_METRIC] for s in sites if s["status"] == "ok"]
    assert uplinks and all(model_bytes < u < 2 * model_bytes for u in uplinks)
    assert all(r["bytes_in"] >= sum(uplinks) / len(rounds) * 0.9 for r in rounds)


@pytest.mark.parametrize("spec", ["none", *LOSSY])
def test_the_simulated_clock_prices_a_sites_uplink_at_what_it_sends(spec):
    """``sent_bytes`` is the encoded update's size without encoding it, so the simulated
    clock (``--site-speeds``) charges a compressed site's link only for what it sends."""
    from fedweave.learning.site_speeds import SiteSpeeds

    compression = Compression.parse(spec)
    reference = _model()
    if compression.active:
        sent, _ = compression.encode(_trained(reference), reference, None)
        assert compression.sent_bytes(reference) == sum(a.nbytes for a in sent)
    model_bytes = sum(a.nbytes for a in reference)
    assert Compression().sent_bytes(reference) == model_bytes
    speeds = SiteSpeeds.parse("equal", 0)
    full = speeds.job_seconds("a", 0, 1, model_bytes)
    priced = speeds.job_seconds("a", 0, 1, model_bytes, compression.sent_bytes(reference))
    assert priced == pytest.approx(full * (model_bytes + compression.sent_bytes(reference))
                                   / (2 * model_bytes))  # fmt: skip
