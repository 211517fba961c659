"""Compressed gossip exchanges (``fedweave peer --compress fp16|int8``, issue 24).

The wire encodings at both ends (``gossip/wire.py``: frames, sizes, what a receiver decodes,
malformed frames dropped with a reason), the exactness of the pairwise sum when both ends mix
with the decoded models, the refusal of top-k for gossip, and two real gossip simulations of
the same seed: the int8 one learns too, and sends well under half the bytes.
"""

from __future__ import annotations

import struct
from collections import OrderedDict

import numpy as np
import pytest

from fedweave.errors import UserError
from fedweave.gossip import averaging, wire
from fedweave.gossip.exchange import gossip_encoding


def _model(seed: int = 0) -> OrderedDict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return OrderedDict(
        [("0.weight", rng.normal(scale=0.1, size=(16, 8)).astype(np.float32)),
         ("0.bias", rng.normal(scale=0.1, size=8).astype(np.float32)),
         ("bn.num_batches_tracked", np.array(5, dtype=np.int64))]
    )  # fmt: skip


def _offer(tensors, encoding: str) -> wire.Message:
    return wire.Message(
        wire.OFFER, "peer-a", "tcp://127.0.0.1:7000", round=3, xid=9, num_examples=100,
        tensors=tensors, encoding=encoding,
    )  # fmt: skip


@pytest.mark.parametrize("encoding, float_bytes", [("raw", 4), ("fp16", 2), ("int8", 1)])
def test_each_encoding_sends_fewer_bytes_and_decodes_to_what_the_sender_expects(
    encoding, float_bytes
):
    model = _model()
    frames = wire.encode(_offer(model, encoding))
    sizes = [len(memoryview(f).cast("B")) for f in frames[1:]]
    scale = 4 if encoding == "int8" else 0  # one float32 scale a tensor
    assert sizes == [128 * float_bytes + scale, 8 * float_bytes + scale, 8]
    decoded = wire.decode(frames, expected_schema=wire.schema_hash(model))
    assert decoded.encoding == encoding and decoded.schema == wire.schema_hash(model)
    expected = wire.as_received(model, encoding)
    for name, array in decoded.tensors.items():
        assert array.dtype == model[name].dtype and array.shape == model[name].shape
        np.testing.assert_array_equal(array, expected[name])  # bit for bit
    error = np.abs(decoded.tensors["0.weight"] - model["0.weight"]).max()
    bound = {"raw": 0.0, "fp16": 1e-3, "int8": np.abs(model["0.weight"]).max() / 254 + 1e-7}
    assert error <= bound[encoding]
    assert decoded.tensors["bn.num_batches_tracked"] == 5


@pytest.mark.parametrize(
    "tamper, reason",
    [
        (lambda f: [f[0], f[1][:-1], *f[2:]], "truncated"),
        (lambda f: [f[0], struct.pack("<f", float("nan")) + bytes(f[1])[4:], *f[2:]],
         "malformed"),
        (lambda f: [f[0], struct.pack("<f", -1.0) + bytes(f[1])[4:], *f[2:]], "malformed"),
        (lambda f: [f[0].replace(b'"encoding":"int8"', b'"encoding":"int4"'), *f[1:]],
         "bad-header"),
        (lambda f: [f[0].replace(b',"encoding":"int8"', b""), *f[1:]], "truncated"),
    ],
)  # fmt: skip
def test_a_malformed_encoded_model_is_dropped_with_its_reason(tamper, reason):
    frames = [bytes(memoryview(f).cast("B")) for f in wire.encode(_offer(_model(), "int8"))]
    with pytest.raises(wire.WireError) as caught:
        wire.decode(tamper(frames))
    assert caught.value.reason == reason


@pytest.mark.parametrize("encoding", ["fp16", "int8"])
def test_both_ends_mixing_the_decoded_models_keeps_the_weighted_sum_exact(encoding):
    """An offerer and a replier, 300 and 100 examples: each moves by the difference of the
    two decoded models, so 300 x + 100 y is what it was (to float32), though neither end had
    the other's exact model."""
    x, y = _model(1), _model(2)
    sent_x, sent_y = wire.as_received(x, encoding), wire.as_received(y, encoding)
    assert any((sent_x[k] != x[k]).any() for k in x)  # lossy: the decoded model differs
    x_after = averaging.pairwise_update(x, sent_x, sent_y, 300, 100)
    y_after = averaging.pairwise_update(y, sent_y, sent_x, 100, 300)
    for key in ("0.weight", "0.bias"):
        before = 300 * x[key].astype(np.float64) + 100 * y[key].astype(np.float64)
        after = 300 * x_after[key].astype(np.float64) + 100 * y_after[key].astype(np.float64)
        np.testing.assert_allclose(after, before, atol=1e-4)
        # and they met: each moved to within the rounding of the weighted average
        average = before / 400
        assert np.abs(x_after[key] - average).max() < np.abs(x[key] - average).max()


def test_gossip_takes_fp16_and_int8_and_refuses_top_k_in_one_line():
    assert [gossip_encoding(k) for k in ("none", "fp16", "int8")] == ["raw", "fp16", "int8"]
    with pytest.raises(UserError, match="gossip peers send whole models"):
        gossip_encoding("topk:0.1")
    with pytest.raises(UserError, match="is not a compression"):
        gossip_encoding("int4")


def test_a_peer_refuses_top_k_in_one_line_before_it_starts(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", "peer", "--listen", "tcp://127.0.0.1:1",
         "--task", "digits", "--insecure", "--data", "site.npz", "--compress", "topk:0.1",
         "--db", "none"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "gossip peers send whole models" in lines[0]


def _gossip_bytes(tmp_path, compress: str) -> tuple[float, int]:
    from fedweave.config import RunConfig
    from fedweave.history import open_store
    from fedweave.simulations.gossip_simulation import GossipSimulation, run_gossip_simulation

    db = f"sqlite:///{tmp_path / f'{compress}.db'}"
    report = run_gossip_simulation(
        GossipSimulation(
            RunConfig.of(clients=4, rounds=6, partition="iid", seed=3, db=db, compress=compress),
            timeout_s=240,
        ),
        work_dir=tmp_path / compress,
    )
    with open_store(db) as store:
        sent = sum(
            row["bytes_out"] for run in store.list_runs() for row in store.rounds(run.run_id)
        )
    return report["final_accuracy"], sent


@pytest.mark.slow
def test_int8_gossip_learns_and_sends_well_under_half_the_bytes(tmp_path):
    raw_accuracy, raw_bytes = _gossip_bytes(tmp_path, "none")
    int8_accuracy, int8_bytes = _gossip_bytes(tmp_path, "int8")
    assert raw_accuracy > 0.6 and int8_accuracy > 0.6  # chance is 0.1
    assert int8_bytes < 0.5 * raw_bytes, (int8_bytes, raw_bytes)
