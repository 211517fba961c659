"""SecAgg+'s masked vector carried in an ``ArrayRecord``, not a ``ConfigRecord`` (issue 36).

Flower 1.41's ``secaggplus_mod`` returns a site's masked vector as a list of byte strings in
its reply's ``ConfigRecord`` (``Key.MASKED_PARAMETERS``). Flower serialises and hashes a
``ConfigRecord`` whole, as one object, and a ClientApp's ``push_message`` does it twice (the
reply's object id, then its object tree); an ``ArrayRecord`` is split into chunks, each hashed
once. Measured on this project's 2-core machine for the 64-4096-4096-10 MLP's 68 MB vector,
through the steps ``push_message`` takes (``bench/bench_secagg_vector_layout.py``): 2.5 s as a
``ConfigRecord``, 0.14 s as an ``ArrayRecord`` on a quiet machine (8.6-11 s against 0.4-0.7 s
with other work beside it), at every site in every SecAgg+ round. Every hop after it (the
SuperNode, the SuperLink, the ServerApp's pull) moves one 68 MB object the same way.

So the site moves the byte strings into its reply's ``MASKED_VECTOR_RECORD`` as it leaves
Flower's mod (``vector_as_arrays``; only where the round's fit config says the coordinator
reads them there, ``SECAGG_VECTOR_ARRAYS_KEY``, so a site and a coordinator of different
fedweave releases keep Flower's layout), and the coordinator's SecAgg+ workflow puts them back
where Flower's collect stage reads them (``vector_where_flower_reads_it``; a reply in Flower's
layout is left as it is). The protocol and
the bytes are unchanged; the history's byte counts too (``traffic.payload_bytes`` counts
arrays and byte strings alike).

Before they go back, the coordinator's grid reads each site's vector layout
(``masked_vector_layout``: integer arrays that NumPy reads from exactly their bytes, and their
shapes); ``coordinator/rounds/site_outcomes.OutcomeGrid`` fails the sites whose vector is
missing, empty, malformed or not laid out as most sites' are, and the protocol unmasks the
others as if those had dropped out. Before, one such reply made Flower's collect or unmask
stage raise, which ended the run (an empty vector: an ``IndexError`` at unmasking).

The Flower code this relies on is fingerprinted: the site's ``secaggplus_mod`` and
``_collect_masked_vectors`` with fedweave's masks (``secagg_masks``, which a site installs
before it masks anything), the coordinator's collect stage with ``secagg_stages``.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np

MASKED_VECTOR_RECORD = "fedweave.masked-vector"
"""The reply's ``ArrayRecord`` that carries a site's masked vector, one array per byte string
of Flower's list, in order."""


def _masked_key() -> str:
    from flwr.common.secure_aggregation.secaggplus_constants import Key

    return str(Key.MASKED_PARAMETERS)


def vector_as_arrays(reply: Any) -> Any:
    """``reply`` (what Flower's ``secaggplus_mod`` returned) with its masked vector moved from
    its config record into ``MASKED_VECTOR_RECORD``; any other reply as it is."""
    from flwr.app import Array, ArrayRecord

    from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS

    if reply.has_error():
        return reply
    config = reply.content.config_records.get(RECORD_KEY_CONFIGS)
    key = _masked_key()
    if config is None or not config.get(key):
        return reply
    reply.content.array_records[MASKED_VECTOR_RECORD] = ArrayRecord(
        array_dict={
            str(index): Array(dtype="", shape=(), stype="numpy.ndarray", data=data)
            for index, data in enumerate(config[key])
        },
    )  # fmt: skip
    config[key] = []
    return reply


def _npy_header(data: bytes) -> tuple[tuple[int, ...], np.dtype, int] | str:
    """The shape, dtype and data offset NumPy's format header of ``data`` declares, or why it
    has none."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, _fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, _fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            return f"NumPy format {version}"
    except (ValueError, TypeError, SyntaxError) as exc:
        return f"not a NumPy array ({type(exc).__name__})"
    return tuple(int(n) for n in shape), dtype, stream.tell()


def _vector_shape(data: object) -> tuple[int, ...] | str:
    """The shape of one array of a masked vector, or why NumPy would not read it as integers
    from exactly these bytes."""
    if not isinstance(data, bytes):
        return f"a {type(data).__name__}, not bytes"
    header = _npy_header(data)
    if isinstance(header, str):
        return header
    shape, dtype, offset = header
    if dtype.kind not in "iu":
        return f"dtype {dtype}, not integers"
    expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        return f"{len(data)} bytes where its header says {expected}"
    return shape


def asks_for_masked_vector(asked: Any) -> bool:
    """Whether ``asked`` is SecAgg+'s collect stage: the instruction whose answer is a site's
    masked vector."""
    from flwr.common.secure_aggregation.secaggplus_constants import Key, Stage

    from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS

    config = asked.content.config_records.get(RECORD_KEY_CONFIGS)
    return config is not None and config.get(Key.STAGE) == Stage.COLLECT_MASKED_VECTORS


def masked_vector_layout(
    reply: Any,
    asked: Any,
    held: Callable[[Any, int], tuple[tuple[int, ...], ...] | None] | None = None,
) -> tuple[tuple[int, ...], ...] | str | None:
    """The shapes of the masked vector ``reply`` carries (in ``MASKED_VECTOR_RECORD`` or where
    Flower puts it) in answer to SecAgg+'s collect stage ``asked``, or why it is none that
    Flower could add up (missing, empty, not integers NumPy reads from exactly its bytes);
    None where ``asked`` is another instruction or ``reply`` an error. A vector the
    coordinator holds in its spool (placeholders, ``HELD_STYPE``) has the shapes ``held``
    (the record, the site's node) says; one ``held`` does not know is refused."""
    from fedweave.bulk.spool import HELD_STYPE
    from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS

    if reply.has_error() or not asks_for_masked_vector(asked):
        return None
    config = reply.content.config_records.get(RECORD_KEY_CONFIGS)
    record = reply.content.array_records.get(MASKED_VECTOR_RECORD)
    if record is not None and any(array.stype == HELD_STYPE for array in record.values()):
        layout = held(record, reply.metadata.src_node_id) if held is not None else None
        return "a placeholder for nothing the coordinator holds" if layout is None else layout
    if record is not None:
        datas = [array.data for array in record.values()]
    elif config is not None and isinstance(config.get(_masked_key()), list):
        datas = list(config[_masked_key()])
    else:
        return "no masked vector"
    if not datas:
        return "an empty masked vector"
    shapes = []
    for index, data in enumerate(datas):
        shape = _vector_shape(data)
        if isinstance(shape, str):
            return f"masked vector array {index}: {shape}"
        shapes.append(shape)
    return tuple(shapes)


def vector_where_flower_reads_it(reply: Any) -> Any:
    """``reply`` with a masked vector that travelled in ``MASKED_VECTOR_RECORD`` back in its
    config record, where Flower's collect stage reads it."""
    from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS

    if reply.has_error():
        return reply
    record = reply.content.array_records.get(MASKED_VECTOR_RECORD)
    config = reply.content.config_records.get(RECORD_KEY_CONFIGS)
    if record is None or config is None:
        return reply
    config[_masked_key()] = [array.data for array in record.values()]
    del reply.content.array_records[MASKED_VECTOR_RECORD]
    return reply


def vector_in_reply(reply: Any) -> Any:
    """The masked vector ``reply`` carries (in ``MASKED_VECTOR_RECORD`` or where Flower puts
    it) as an ``array_parts.UpdateInMemory`` over its bytes (no copy); ``BlobError`` where
    NumPy would not read it."""
    from fedweave.bulk.array_parts import UpdateInMemory
    from fedweave.bulk.records import npy_array
    from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS

    record = reply.content.array_records.get(MASKED_VECTOR_RECORD)
    if record is not None:
        datas = [array.data for array in record.values()]
    else:
        datas = list(reply.content.config_records[RECORD_KEY_CONFIGS][_masked_key()])
    return UpdateInMemory([npy_array(np.frombuffer(data, np.uint8)) for data in datas])


def drop_vector(reply: Any) -> None:
    """Let go of the masked vector ``reply`` carries, once it is added up."""
    from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS

    if MASKED_VECTOR_RECORD in reply.content.array_records:
        del reply.content.array_records[MASKED_VECTOR_RECORD]
    config = reply.content.config_records.get(RECORD_KEY_CONFIGS)
    if config is not None and _masked_key() in config:
        config[_masked_key()] = []
