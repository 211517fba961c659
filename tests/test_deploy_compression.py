"""Compressed updates both ways on Flower's deployment engine: a coordinator and three sites
as real processes on loopback with TLS and site keys, SecAgg+ off, ``--compress int8`` up and
``--downlink fp16`` down. Every site sends its update int8-compressed (its console says so,
with the bytes), encoded against the half-precision model it received and restored; the
coordinator decodes it against its own full-precision model, and the history records each
site's uplink bytes and each round's bytes in and out (null in deployment before issue 24),
the model out at half precision (issue 36).

The tensors move beside Flower's messages (``--bulk-address``, issue 36), so the plain rounds
add up the updates held on disk one at a time (``spooled_updates.py``): the counts stay the
updates' own bytes, and nothing is left held once the run ends."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common import ndarray_to_bytes
from test_deploy_support import (
    Processes,
    coordinator_args,
    free_port,
    make_deployment,
    recorded,
    site_args,
    start_coordinator,
    wait_for_success,
)

ROUNDS = 2
SITES = 3


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_deployed_sites_send_int8_updates_and_the_history_counts_their_bytes(tmp_path):
    from fedweave.downlink import halved
    from fedweave.learning.compression import Compression
    from fedweave.learning.tasks import load_task
    from fedweave.learning.weights import get_weights

    weights = get_weights(load_task("digits").build_model())
    model_bytes = sum(len(ndarray_to_bytes(w)) for w in weights)
    half_bytes = sum(len(ndarray_to_bytes(w)) for w in halved(weights)[0])
    sent, _ = Compression.parse("int8").encode(weights, weights, None)
    int8_bytes = sum(len(ndarray_to_bytes(np.asarray(a))) for a in sent)

    make_deployment(tmp_path, SITES)
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port, bulk_port = free_port(), free_port()
    procs = Processes(tmp_path)
    try:
        coord = start_coordinator(
            procs, *coordinator_args(port, db, ROUNDS, SITES, "--once", "--no-secure-agg",
                                     "--compress", "int8", "--downlink", "fp16",
                                     "--bulk-address", f"127.0.0.1:{bulk_port}"),
        )  # fmt: skip
        for i in range(SITES):
            procs.start(f"site{i}", *site_args(port, i))
        out = wait_for_success(procs, coord, "the run to complete")
        site_out = procs.output("site0")
    finally:
        procs.close()

    assert "updates sent int8-compressed, with error feedback" in out
    assert f", {SITES * ROUNDS} uploaded (" in out, out[-3000:]  # every update, beside Flower
    assert not [p for p in tmp_path.rglob("held/*")], "an update left held on disk"
    assert "global model sent at fp16 (half the bytes down)" in out
    assert "update sent in the clear, int8-compressed (" in site_out, site_out[-3000:]
    rounds, site_rows, run = recorded(db)
    assert run.status == "completed" and [r["round"] for r in rounds] == [1, 2]
    assert [s["status"] for s in site_rows] == ["ok"] * SITES * ROUNDS, site_rows
    assert {s["metrics"]["uplink_bytes"] for s in site_rows} == {int8_bytes}
    assert int8_bytes < model_bytes / 3.9
    for row in rounds:
        assert row["bytes_in"] == SITES * int8_bytes  # evaluation replies carry no arrays
        # the model, at half precision, to each site to train and to evaluate
        assert row["bytes_out"] == 2 * SITES * half_bytes < SITES * model_bytes * 1.1, row
    assert rounds[-1]["eval_accuracy"] > 0.5, rounds[-1]  # chance is 0.1 on ten digits
