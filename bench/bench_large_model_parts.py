"""Where a deployed round of a large model could spend its time outside training (issue 24):
each suspect step, timed alone on this machine, for the 64-4096-4096-10 MLP the issue names
(17.1M parameters, 68 MB).

    python bench/bench_large_model_parts.py [--repeats 3] [--sites 3]

Issue 24 measured 19.6 s a round plain and 28.5 s with SecAgg+ for three sites, of which
local training is ~11.9 s. This script does not run a deployment: it times, with the real
functions a round calls, the steps that handle the model's bytes, once per call (median of
``--repeats``), and says how many times a plain round calls each (three sites: the model goes
to each to train and to evaluate, each sends its model back). What is left of the round's
7.7 s after these is the deployment itself: gRPC, TLS, the SuperLink's object store, the
SuperNode's and the worker's process hops.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np


def timed(step: Callable[[], object], repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sites", type=int, default=3)
    args = parser.parse_args()

    from flwr.app import Message, Metadata
    from flwr.app.message_type import MessageType
    from flwr.common import (
        Code,
        FitIns,
        FitRes,
        Status,
        ndarrays_to_parameters,
        parameters_to_ndarrays,
    )
    from flwr.compat.common import recorddict_compat as compat
    from flwr.server.strategy.aggregate import aggregate
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

    from fedweave.learning.compression import Compression
    from fedweave.learning.validation import update_problem
    from fedweave.learning.weights import save_weights_npz, weights_sha256

    rng = np.random.default_rng(0)
    shapes = [(4096, 64), (4096,), (4096, 4096), (4096,), (10, 4096), (10,)]
    model = [rng.normal(scale=0.02, size=s).astype(np.float32) for s in shapes]
    local = [w + rng.normal(scale=1e-3, size=w.shape).astype(np.float32) for w in model]
    size = sum(w.nbytes for w in model)
    print(f"model: {sum(w.size for w in model) / 1e6:.1f}M parameters, {size / 1e6:.0f} MB")
    parameters = ndarrays_to_parameters(model)
    fit_ins = FitIns(parameters, {"round": 1})
    content = compat.fitins_to_recorddict(fit_ins, keep_input=True)

    def message() -> Message:
        metadata = Metadata(
            run_id=1, message_id="", src_node_id=0, dst_node_id=1, reply_to_message_id="",
            group_id="1", created_at=time.time(), ttl=60.0, message_type=MessageType.TRAIN,
        )  # fmt: skip
        return Message(content=content, metadata=metadata)

    def deflated() -> dict[str, bytes]:
        return {oid: obj.deflate() for oid, obj in get_all_nested_objects(message()).items()}

    contents = deflated()
    root = list(contents)[-1]
    results = [(None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(local), 100, {}))] * 3
    sites = args.sites
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "round.npz"
        steps: list[tuple[str, Callable[[], object], int]] = [
            ("serialise the model (ndarrays_to_parameters)", lambda: ndarrays_to_parameters(model),
             1 + sites),
            ("read it back (parameters_to_ndarrays)", lambda: parameters_to_ndarrays(parameters),
             2 * sites + 1),
            ("legacy records (fitins_to_recorddict)",
             lambda: compat.fitins_to_recorddict(fit_ins, keep_input=True), 2 * sites),
            ("object store: deflate + ids (sha256 of every chunk)", deflated, 4 * sites),
            ("object store: inflate from contents",
             lambda: inflate_object_from_contents(root, dict(contents), keep_object_contents=True),
             4 * sites),
            ("the update check (update_problem)", lambda: update_problem(local, model), 2 * sites),
            ("FedAvg of the sites (flwr aggregate)",
             lambda: aggregate([(parameters_to_ndarrays(r.parameters), 100) for _, r in results]),
             1),
            ("checkpoint write (save_weights_npz)", lambda: save_weights_npz(checkpoint, model), 1),
            ("model fingerprint (weights_sha256)", lambda: weights_sha256(model), 1),
            ("int8 compression at a site (encode)",
             lambda: Compression.parse("int8").encode(local, model, None), 0),
        ]  # fmt: skip
        total = 0.0
        print(f"{'step':55s} {'once':>8s} {'calls':>6s} {'a round':>8s}")
        for name, step, calls in steps:
            seconds = timed(step, args.repeats)
            total += seconds * calls
            print(f"{name:55s} {seconds:7.3f}s {calls:6d} {seconds * calls:7.2f}s")
        print(f"{'sum of the counted calls':55s} {'':8s} {'':6s} {total:7.2f}s")
    print("the calls a plain round makes are an estimate: one per send/receive of the model "
          f"at each of {sites} sites and at the coordinator; 0: not on the plain path")  # fmt: skip


if __name__ == "__main__":
    main()
