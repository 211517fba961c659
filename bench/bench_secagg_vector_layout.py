"""What a site's SecAgg+ reply costs to leave, with its masked vector in Flower's
``ConfigRecord`` or in fedweave's ``ArrayRecord`` (issue 36,
``fedweave/flower_patches/secagg_vectors.py``).

    python bench/bench_secagg_vector_layout.py [--parameters 17121290] [--repeats 3]

The reply is built as the site's SecAgg+ mod builds it (the weight factor, then one flat
uint32 vector of the model's size, each in NumPy's format), once in each layout, and put
through the steps Flower 1.41's ``push_message`` takes before any byte leaves the process:
the message's object id, its object tree, and every object's serialised form. Prints the
median seconds of each step per layout and the ratio. The default size is the
64-4096-4096-10 MLP of ``bench_large_model.py`` (17.1M parameters, a 68 MB vector).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def reply(layout: str, blobs: list[bytes]):  # type: ignore[no-untyped-def]
    """A collect-stage reply carrying ``blobs`` in ``layout`` (``config`` or ``arrays``)."""
    from flwr.app import ConfigRecord, Message, Metadata, RecordDict
    from flwr.app.message_type import MessageType

    from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS
    from fedweave.flower_patches.secagg_vectors import vector_as_arrays

    metadata = Metadata(
        run_id=1, message_id="asked", src_node_id=0, dst_node_id=5, reply_to_message_id="",
        group_id="1", created_at=time.time(), ttl=600.0, message_type=MessageType.TRAIN,
    )  # fmt: skip
    content = RecordDict()
    content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord({"masked_params": list(blobs)},
                                                              False)  # fmt: skip
    message = Message(content, reply_to=Message(content=RecordDict(), metadata=metadata))
    return vector_as_arrays(message) if layout == "arrays" else message


def leave(message) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Seconds of each step ``push_message`` takes on ``message`` before sending."""
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
        no_object_id_recompute,
    )

    started = time.perf_counter()
    message.metadata.__dict__["_message_id"] = message.object_id
    identified = time.perf_counter()
    message_to_proto(remove_content_from_message(message))
    with no_object_id_recompute():
        get_object_tree(message)
        treed = time.perf_counter()
        for obj in get_all_nested_objects(message).values():
            obj.deflate()
    done = time.perf_counter()
    return {"object id": identified - started, "object tree": treed - identified,
            "serialise": done - treed, "total": done - started}  # fmt: skip


def main() -> None:
    import numpy as np
    from flwr.common import ndarray_to_bytes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parameters", type=int, default=64 * 4096 + 4096 + 4096 * 4096
                        + 4096 + 4096 * 10 + 10)  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    blobs = [
        ndarray_to_bytes(np.array([1234], dtype=np.int64)),
        ndarray_to_bytes(rng.integers(0, 2**32, args.parameters, dtype=np.uint32)),
    ]
    print(f"masked vector of {args.parameters:,} parameters: "
          f"{sum(map(len, blobs)) / 1e6:.1f} MB", flush=True)  # fmt: skip
    medians = {}
    for layout in ("config", "arrays"):
        runs = [leave(reply(layout, blobs)) for _ in range(args.repeats)]
        medians[layout] = {step: statistics.median(r[step] for r in runs) for step in runs[0]}
        print(f"{layout:7s}: " + ", ".join(f"{step} {sec:.3f} s"
                                           for step, sec in medians[layout].items()),
              flush=True)  # fmt: skip
    ratio = medians["arrays"]["total"] / medians["config"]["total"]
    print(f"array record / config record: {ratio:.3f}x the seconds before the reply leaves")


if __name__ == "__main__":
    sys.exit(main())
