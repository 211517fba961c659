"""A deployed coordinator started from a pretrained model (``--initial-model``, issue 35):
three sites as real processes on loopback with TLS and site keys, one round at ``--lr 0`` so
nothing moves. The sites train and evaluate the file's model (the pretrained accuracy from
round 1), the history pins the file's sha256, and the exported model is the file's."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from test_deploy_support import (
    Processes,
    coordinator_args,
    free_port,
    make_deployment,
    recorded,
    run_fedweave,
    site_args,
    start_coordinator,
    wait_for_success,
)
from test_initial_model import _pretrained

SITES = 3


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_deployed_run_starts_from_the_initial_model_and_pins_it(tmp_path):
    from safetensors.numpy import load_file

    make_deployment(tmp_path, SITES)
    start = _pretrained(tmp_path / "pretrained.safetensors")
    db = f"sqlite:///{tmp_path / 'history.db'}"
    port = free_port()
    procs = Processes(tmp_path)
    try:
        coord = start_coordinator(
            procs, *coordinator_args(port, db, 1, SITES, "--once", "--no-secure-agg", "--lr",
                                     "0", "--initial-model", "pretrained.safetensors"),
        )  # fmt: skip
        for i in range(SITES):
            procs.start(f"site{i}", *site_args(port, i))
        wait_for_success(procs, coord, "the run to complete")
    finally:
        procs.close()
    rounds, _, run = recorded(db)
    assert run.status == "completed" and len(rounds) == 1
    assert run.config["initial_model"] == {
        "path": str(start.resolve()),
        "sha256": hashlib.sha256(start.read_bytes()).hexdigest(),
        "tensors": 6,
    }
    assert rounds[0]["eval_accuracy"] > 0.8, rounds[0]  # the fresh model scores ~0.1
    done = run_fedweave("history", "export", run.run_id, "--db", db, "--to", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    exported, pretrained = load_file(str(tmp_path / "out" / "model.safetensors")), load_file(
        str(start)
    )
    assert list(exported) == list(pretrained)
    for name, array in pretrained.items():
        np.testing.assert_allclose(exported[name], array, atol=1e-6, err_msg=name)
