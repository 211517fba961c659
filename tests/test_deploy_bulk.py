"""Tensors beside Flower's messages, deployed (``fedweave coordinator --bulk-address``, issue
36): a coordinator and three sites as real processes on loopback with TLS, site keys and
SecAgg+. Every model goes to the sites through the coordinator's transfer server over HTTPS
and every masked vector comes back the same way (the coordinator's closing count says how
many, and how many bytes: the history's own counts); the run learns, and the history's bytes
in and out count the tensors as Flower's path does."""

from __future__ import annotations

import re

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
def test_deployed_secagg_rounds_move_their_tensors_over_the_transfer_server(tmp_path):
    from fedweave.learning.tasks import load_task
    from fedweave.learning.weights import get_weights

    weights = get_weights(load_task("digits").build_model())
    model_bytes = sum(len(ndarray_to_bytes(w)) for w in weights)

    make_deployment(tmp_path, SITES)
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port, bulk_port = free_port(), free_port()
    procs = Processes(tmp_path)
    try:
        coord = start_coordinator(
            procs, *coordinator_args(port, db, ROUNDS, SITES, "--once",
                                     "--bulk-address", f"127.0.0.1:{bulk_port}"),
        )  # fmt: skip
        for i in range(SITES):
            procs.start(f"site{i}", *site_args(port, i))
        out = wait_for_success(procs, coord, "the run to complete")
    finally:
        procs.close()

    assert f"tensors move over https at 127.0.0.1:{bulk_port}" in out, out[-3000:]
    rounds, site_rows, run = recorded(db)
    assert run.status == "completed" and [r["round"] for r in rounds] == [1, 2]
    assert [s["status"] for s in site_rows] == ["ok"] * SITES * ROUNDS, site_rows
    counted = re.search(
        r"transfers beside the messages: (\d+) fetched \(([\d,]+) bytes\), (\d+) uploaded "
        r"\(([\d,]+) bytes\), (\d+) refused", out,
    )  # fmt: skip
    assert counted, out[-3000:]
    fetched, fetched_bytes, uploaded, uploaded_bytes, refused = counted.groups()
    fetched_bytes, uploaded_bytes = (int(n.replace(",", "")) for n in counted.group(2, 4))
    # each round: the model to every site to train (SecAgg+'s collect stage) and to evaluate
    assert int(fetched) == 2 * SITES * ROUNDS and int(refused) == 0
    assert int(uploaded) == SITES * ROUNDS  # the masked vectors; evaluation replies have none
    # the history counts the tensors as before (and SecAgg+'s keys and shares beside them)
    for row in rounds:
        assert 2 * SITES * model_bytes < row["bytes_out"] < 2 * SITES * model_bytes * 1.1, row
    header = 4096  # the most a blob's safetensors header adds to the tensors' bytes
    assert 0 <= fetched_bytes - 2 * SITES * ROUNDS * model_bytes < int(fetched) * header
    vectors = sum(r["bytes_in"] for r in rounds)
    assert 0.8 * vectors < uploaded_bytes < vectors + int(uploaded) * header
    assert rounds[-1]["eval_accuracy"] > 0.5, rounds[-1]  # chance is 0.1 on ten digits
