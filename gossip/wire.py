"""The gossip wire format: the ONLY place it is defined (see ``gossip/PROTOCOL.md``).

A message is a list of ZeroMQ frames: one header frame (magic, version, UTF-8 JSON) and then
one raw little-endian C-order frame per tensor. Decoding never unpickles and never trusts a
length it has not checked; every problem raises ``WireError`` with a short ``reason`` the
receiver counts, so a malformed message costs the receiver one exception, not its life.
Received tensors are ``np.frombuffer`` views on the ZeroMQ frames (zero-copy, read-only),
except under a lossy ``encoding`` (``fp16``, ``int8``), which is decoded into new arrays.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAGIC = b"FWGP"
PROTOCOL_VERSION = 1
_PREFIX = struct.Struct(">4sH")  # magic, version (big-endian uint16)

MAX_HEADER_BYTES = 64 * 1024
"""Header frame limit (prefix + JSON); bigger headers are dropped as ``header-too-large``."""
MAX_TENSORS = 4096
MAX_DIMS = 8
MAX_NAME_CHARS = 256
MAX_PEERS_PER_MESSAGE = 64
MAX_REASON_CHARS = 200
MAX_SLOT_LENGTH_SECONDS = 3600.0
MAX_SLOT_OFFSET_SECONDS = 7 * 86400.0
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30
"""Default limit on a whole message (all tensor bytes): 1 GiB; ``--max-message-mb`` changes it."""

HELLO, PEERS, OFFER, REPLY, BYE = "hello", "peers", "model-offer", "model-reply", "bye"
MESSAGE_TYPES = frozenset({HELLO, PEERS, OFFER, REPLY, BYE})
MODEL_TYPES = frozenset({OFFER, REPLY})
REQUIRED_FIELDS = ("type", "sender", "addr", "round", "xid")
"""Header keys every message must carry (PROTOCOL.md §6)."""
MODEL_REQUIRED_FIELDS = ("num_examples", "pull", "status", "schema", "tensors")
"""Header keys a model message must also carry: an offer without ``num_examples`` would be
mixed with a weight nobody stated."""

DTYPES = {
    "<f2": np.dtype("<f2"),
    "<f4": np.dtype("<f4"),
    "<f8": np.dtype("<f8"),
    "|i1": np.dtype("|i1"),
    "<i2": np.dtype("<i2"),
    "<i4": np.dtype("<i4"),
    "<i8": np.dtype("<i8"),
    "|u1": np.dtype("|u1"),
    "|b1": np.dtype("|b1"),
}
"""Allowed tensor dtypes, by NumPy's ``dtype.str`` (always little-endian on the wire)."""

ENCODINGS = ("raw", "fp16", "int8")
"""How a model message's floating tensors travel (header ``encoding``, absent: ``raw``):
``raw`` as they are; ``fp16`` as float16; ``int8`` as a float32 scale (``max |x| / 127``)
then one int8 level a value. Other tensors always travel raw. ``tensors`` and ``schema``
describe the model, not the frames: the receiver decodes to the model's dtypes."""
INT8_LEVELS = 127

_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_REASON_RE = re.compile(r"^[ -~]*$")  # printable ASCII: safe to log
_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
_ADDR_RE = re.compile(r"^tcp://[A-Za-z0-9._\-\[\]:*]{1,250}:[0-9]{1,5}$")


class WireError(ValueError):
    """A message that breaks the format; ``reason`` is a short counter key. ``message`` holds
    the header fields already decoded when the fault is one the sender should be told about
    (``schema-mismatch``: the receiver answers an offer with ``refused`` and the reason)."""

    def __init__(self, reason: str, detail: str = "", message: Message | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class PeerEntry:
    """A peer as gossiped in a ``peers`` list: id, listen address, last round it claimed."""

    peer_id: str
    addr: str
    round: int = 0


@dataclass
class Message:
    """One decoded (or to-be-encoded) gossip message.

    ``tensors`` is empty except for model messages; ``schema`` is the sha256 hex of the
    tensor names/dtypes/shapes (see ``schema_hash``) and must equal the receiver's own;
    ``start`` is the sha256 hex of the initial model file the sender started from (``""``:
    the task's own initialisation) and must equal the receiver's own too.
    """

    type: str
    sender: str
    addr: str = ""
    round: int = 0
    xid: int = 0
    peers: list[PeerEntry] = field(default_factory=list)
    num_examples: int = 0
    schema: str = ""
    start: str = ""
    pull: bool = False
    status: str = "ok"
    share: float | None = None
    radius: float | None = None
    scale: float | None = None
    slot: tuple[int, float, float] | None = None
    reason: str = ""
    done: bool = False
    encoding: str = "raw"
    tensors: OrderedDict[str, np.ndarray] = field(default_factory=OrderedDict)


def tensor_specs(tensors: Mapping[str, np.ndarray]) -> list[list[Any]]:
    """``[[name, dtype, shape], ...]`` as they appear in the header (wire dtypes)."""
    return [[name, _wire_dtype(a).str, list(a.shape)] for name, a in tensors.items()]


def schema_hash(tensors: Mapping[str, np.ndarray] | Sequence[Sequence[Any]]) -> str:
    """sha256 hex of the canonical JSON of ``[[name, dtype, shape], ...]`` (order matters).

    Two peers exchange models only when this matches, so a peer running another model (or
    another version of it) is dropped cleanly instead of being averaged into garbage.
    """
    specs = tensor_specs(tensors) if isinstance(tensors, Mapping) else [list(s) for s in tensors]
    canonical = json.dumps(specs, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _wire_dtype(array: np.ndarray) -> np.dtype:
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    if dtype.str not in DTYPES:
        raise WireError("bad-dtype", f"dtype {array.dtype} cannot go on the wire")
    return dtype


def _encoded(array: np.ndarray, encoding: str) -> np.ndarray | bytes:
    """One tensor's frame under ``encoding`` (PROTOCOL.md §3.3)."""
    wire = np.ascontiguousarray(array, dtype=_wire_dtype(array))
    if not _lossy(wire.dtype, encoding):
        return wire
    if encoding == "fp16":
        return wire.astype("<f2")
    peak = float(np.abs(wire).max(initial=0.0))
    scale = np.float32(peak / INT8_LEVELS if peak > 0 else 1.0)
    levels = np.clip(np.rint(wire / scale), -INT8_LEVELS, INT8_LEVELS).astype("|i1")
    return np.asarray(scale, "<f4").tobytes() + levels.tobytes()


def _frame_size(dtype: np.dtype, shape: tuple[int, ...], encoding: str) -> int:
    count = math.prod(shape)
    if not _lossy(dtype, encoding):
        return count * dtype.itemsize
    return 2 * count if encoding == "fp16" else 4 + count


def _lossy(dtype: np.dtype, encoding: str) -> bool:
    """Whether a tensor of ``dtype`` travels encoded (a floating one wider than the code)."""
    return (
        encoding != "raw" and dtype.kind == "f" and not (encoding == "fp16" and dtype.itemsize <= 2)
    )


def _decoded(data: memoryview, dtype: np.dtype, shape: tuple[int, ...], encoding: str):
    """A tensor of ``dtype`` and ``shape`` from its frame (length already checked)."""
    if not _lossy(dtype, encoding):
        return np.frombuffer(data, dtype=dtype).reshape(shape)  # zero-copy, read-only
    if encoding == "fp16":
        return np.frombuffer(data, dtype="<f2").astype(dtype).reshape(shape)
    scale = np.frombuffer(data[:4], dtype="<f4")[0]
    if not (math.isfinite(float(scale)) and scale > 0):
        raise WireError("malformed", "an int8 tensor's scale must be finite and positive")
    levels = np.frombuffer(data[4:], dtype="|i1")
    return (levels.astype(np.float32) * scale).astype(dtype).reshape(shape)


def as_received(tensors: Mapping[str, np.ndarray], encoding: str) -> OrderedDict[str, np.ndarray]:
    """The model a receiver decodes from ``tensors`` sent under ``encoding``, bit for bit:
    both ends of an exchange mix with what was decoded, so the pairwise sum stays exact."""
    if encoding == "raw":
        return OrderedDict(tensors)
    out: OrderedDict[str, np.ndarray] = OrderedDict()
    for name, array in tensors.items():
        frame = _encoded(array, encoding)
        raw = frame if isinstance(frame, bytes) else memoryview(frame.reshape(-1)).cast("B")
        out[name] = _decoded(memoryview(raw), _wire_dtype(array), array.shape, encoding)
    return out


def encode(message: Message) -> list[Any]:
    """Frames for ``message``: header bytes then one buffer per tensor (no copies when the
    arrays are already contiguous little-endian; send them with ``copy=False``)."""
    if message.type not in MESSAGE_TYPES:
        raise WireError("unknown-type", message.type)
    header: dict[str, Any] = {
        "type": message.type,
        "sender": message.sender,
        "addr": message.addr,
        "round": int(message.round),
        "xid": int(message.xid),
    }
    if message.peers:
        header["peers"] = [[p.peer_id, p.addr, int(p.round)] for p in message.peers]
    if message.slot is not None:
        round_, offset, length = message.slot
        header["slot"] = [int(round_), round(float(offset), 6), round(float(length), 6)]
    if message.done:
        header["done"] = True
    if message.reason and message.type not in MODEL_TYPES:
        header["reason"] = message.reason[:MAX_REASON_CHARS]
    buffers: list[Any] = []
    if message.type in MODEL_TYPES:
        header["num_examples"] = int(message.num_examples)
        header["pull"] = bool(message.pull)
        if message.share is not None:
            header["share"] = float(message.share)
        if message.radius is not None:
            header["radius"] = float(message.radius)
        if message.scale is not None:
            header["scale"] = float(message.scale)
        header["status"] = message.status
        if message.reason:
            header["reason"] = message.reason[:MAX_REASON_CHARS]
        specs = tensor_specs(message.tensors)
        header["tensors"] = specs
        header["schema"] = message.schema or schema_hash(specs)
        if message.start:
            header["start"] = message.start
        if message.encoding not in ENCODINGS:
            raise WireError("bad-header", f"encoding {message.encoding}")
        if message.encoding != "raw" and message.tensors:
            header["encoding"] = message.encoding
        for array in message.tensors.values():
            frame = _encoded(array, message.encoding)
            if isinstance(frame, bytes):
                buffers.append(frame)
            else:
                buffers.append(memoryview(frame.reshape(-1)).cast("B") if frame.size else b"")
    body = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    head = _PREFIX.pack(MAGIC, PROTOCOL_VERSION) + body
    if len(head) > MAX_HEADER_BYTES:
        raise WireError("header-too-large", f"{len(head)} bytes")
    return [head, *buffers]


def _frame_bytes(frame: Any) -> memoryview:
    buffer = getattr(frame, "buffer", frame)
    return memoryview(buffer).cast("B") if not isinstance(buffer, memoryview) else buffer


def _int(header: Mapping[str, Any], key: str, default: int = 0, hi: int = 2**63 - 1) -> int:
    value = header.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise WireError("bad-header", f"{key} must be an integer in [0, {hi}]")
    return value


def _str(header: Mapping[str, Any], key: str, pattern: re.Pattern[str] | None, limit: int) -> str:
    value = header.get(key, "")
    if not isinstance(value, str) or len(value) > limit:
        raise WireError("bad-header", f"{key} must be a string of at most {limit} chars")
    if pattern is not None and value and not pattern.match(value):
        raise WireError("bad-header", f"{key} has invalid characters")
    return value


def decode_header(frame: Any) -> dict[str, Any]:
    """Check the prefix and parse the JSON header (size-limited) of one frame."""
    data = _frame_bytes(frame)
    if len(data) > MAX_HEADER_BYTES:
        raise WireError("header-too-large", f"{len(data)} bytes")
    if len(data) < _PREFIX.size:
        raise WireError("malformed", "header shorter than its prefix")
    magic, version = _PREFIX.unpack(data[: _PREFIX.size])
    if magic != MAGIC:
        raise WireError("malformed", "bad magic")
    if version != PROTOCOL_VERSION:
        raise WireError("bad-version", f"version {version}, this peer speaks {PROTOCOL_VERSION}")
    try:
        header = json.loads(bytes(data[_PREFIX.size :]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError("malformed", f"header is not JSON ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise WireError("malformed", "header is not a JSON object")
    return header


def _peers(raw: Any) -> list[PeerEntry]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_PEERS_PER_MESSAGE:
        raise WireError("bad-header", f"peers must be a list of at most {MAX_PEERS_PER_MESSAGE}")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 3):
            raise WireError("bad-header", "peer entries are [id, addr, round]")
        pid, addr, rnd = item
        if not (isinstance(pid, str) and _ID_RE.match(pid)):
            raise WireError("bad-header", "peer id")
        if not (isinstance(addr, str) and _ADDR_RE.match(addr)):
            raise WireError("bad-header", "peer addr")
        if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 0:
            raise WireError("bad-header", "peer round")
        out.append(PeerEntry(pid, addr, rnd))
    return out


def _slot(raw: Any) -> tuple[int, float, float] | None:
    if raw is None:
        return None
    if not (isinstance(raw, list) and len(raw) == 3):
        raise WireError("bad-header", "slot is [round, offset, length]")
    round_, offset, length = raw
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw)
    if not numbers or not isinstance(round_, int) or not 0 <= round_ < 2**53:
        raise WireError("bad-header", "slot round")
    if not (math.isfinite(offset) and abs(offset) <= MAX_SLOT_OFFSET_SECONDS):
        raise WireError("bad-header", "slot offset")
    if not (math.isfinite(length) and 0 < length <= MAX_SLOT_LENGTH_SECONDS):
        raise WireError("bad-header", "slot length")
    return round_, float(offset), float(length)


def _specs(raw: Any) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    if not isinstance(raw, list) or len(raw) > MAX_TENSORS:
        raise WireError("bad-header", f"tensors must be a list of at most {MAX_TENSORS}")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 3):
            raise WireError("bad-header", "tensor entries are [name, dtype, shape]")
        name, dtype, shape = item
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
            raise WireError("bad-header", "tensor name")
        if dtype not in DTYPES:
            raise WireError("bad-dtype", str(dtype)[:16])
        if not isinstance(shape, list) or len(shape) > MAX_DIMS:
            raise WireError("bad-header", "tensor shape")
        if any(isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < 2**40 for d in shape):
            raise WireError("bad-header", "tensor shape")
        out.append((name, DTYPES[dtype], tuple(shape)))
    return out


def decode(
    frames: Sequence[Any],
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    expected_schema: str | None = None,
    check_finite: bool = True,
    expected_start: str | None = None,
) -> Message:
    """Parse frames (without any ZeroMQ routing id) into a ``Message`` or raise ``WireError``.

    Args:
        frames: header frame then tensor frames, as bytes, memoryviews or ``zmq.Frame``.
        max_message_bytes: limit on the sum of all frames (default 1 GiB).
        expected_schema: when set, model messages with another schema hash are refused
            (``schema-mismatch``); pull requests and non-``ok`` replies carry no tensors.
        check_finite: refuse float tensors holding NaN or infinity (``non-finite``), which
            would otherwise poison every model they are averaged into.
        expected_start: when set, model messages whose ``start`` (the initial model's
            sha256, absent: the task's own initialisation) differs are refused
            (``start-mismatch``), checked as the schema is.
    """
    if not frames:
        raise WireError("malformed", "no frames")
    header = decode_header(frames[0])
    mtype = header.get("type")
    if mtype not in MESSAGE_TYPES:
        raise WireError("unknown-type", str(mtype)[:32])
    required = REQUIRED_FIELDS + (MODEL_REQUIRED_FIELDS if mtype in MODEL_TYPES else ())
    missing = [key for key in required if key not in header]
    if missing:
        raise WireError("bad-header", f"{mtype} without {', '.join(missing)}")
    sender = _str(header, "sender", _ID_RE, 64)
    if not sender:
        raise WireError("bad-header", "sender is required")
    addr = _str(header, "addr", _ADDR_RE, 256)
    message = Message(
        type=mtype,
        sender=sender,
        addr=addr,
        round=_int(header, "round"),
        xid=_int(header, "xid"),
        peers=_peers(header.get("peers")),
        slot=_slot(header.get("slot")),
    )
    done = header.get("done", False)
    if not isinstance(done, bool):
        raise WireError("bad-header", "done must be true or false")
    message.done = done
    message.reason = _str(header, "reason", _REASON_RE, MAX_REASON_CHARS)
    if mtype not in MODEL_TYPES:
        if len(frames) != 1:
            raise WireError("malformed", f"{mtype} carries no tensor frames")
        return message
    message.num_examples = _int(header, "num_examples", hi=2**53)
    pull = header.get("pull", False)
    status = header.get("status", "ok")
    if not isinstance(pull, bool) or status not in ("ok", "busy", "refused"):
        raise WireError("bad-header", "pull/status")
    message.pull, message.status = pull, status
    share = header.get("share")
    if share is not None:
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise WireError("bad-header", "share must be a number in (0, 1]")
        message.share = float(share)
    radius = header.get("radius")
    if radius is not None:
        if (
            isinstance(radius, bool) or not isinstance(radius, (int, float))
            or not 0 < radius < math.inf
        ):  # fmt: skip
            raise WireError("bad-header", "radius must be a positive finite number")
        message.radius = float(radius)
    scale = header.get("scale")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 1:
            raise WireError("bad-header", "scale must be a number in (0, 1]")
        message.scale = float(scale)
    encoding = header.get("encoding", "raw")
    if encoding not in ENCODINGS:
        raise WireError("bad-header", f"encoding must be one of {', '.join(ENCODINGS)}")
    message.encoding = encoding
    specs = _specs(header.get("tensors", []))
    schema = _str(header, "schema", None, 64)
    message.schema = schema
    if len(frames) != len(specs) + 1:
        raise WireError("truncated", f"{len(frames) - 1} tensor frames for {len(specs)} tensors")
    if specs and schema != schema_hash([[n, d.str, list(s)] for n, d, s in specs]):
        raise WireError("bad-schema", "schema hash does not match the tensor list")
    checked = mtype == OFFER or status == "ok"  # busy/refused replies may come from anyone
    if checked and expected_schema is not None and schema != expected_schema:
        raise WireError("schema-mismatch", schema[:12], message)
    start = header.get("start", "")
    if not isinstance(start, str) or (start and not _DIGEST_RE.match(start)):
        raise WireError("bad-header", "start must be 64 lowercase hex digits")
    message.start = start
    if checked and expected_start is not None and start != expected_start:
        raise WireError("start-mismatch", (start or "none")[:12], message)
    if not specs:
        if mtype == OFFER and not pull:
            raise WireError("malformed", "an offer without tensors must be a pull")
        return message
    total = 0
    for frame, (name, dtype, shape) in zip(frames[1:], specs, strict=False):
        data = _frame_bytes(frame)
        expected = _frame_size(dtype, shape, encoding)
        if len(data) != expected:
            raise WireError("truncated", f"{name}: {len(data)} bytes, expected {expected}")
        total += expected
        if total > max_message_bytes:
            raise WireError("too-large", f"over {max_message_bytes} bytes")
        if name in message.tensors:
            raise WireError("bad-header", f"duplicate tensor {name}")
        array = _decoded(data, dtype, shape, encoding)
        if check_finite and dtype.kind == "f" and not np.isfinite(array).all():
            raise WireError("non-finite", name)
        message.tensors[name] = array
    return message


def valid_peer_id(peer_id: str) -> bool:
    """Whether ``peer_id`` is acceptable on the wire (1-64 of ``[A-Za-z0-9_-]``)."""
    return bool(_ID_RE.match(peer_id))


def valid_addr(addr: str) -> bool:
    """Whether ``addr`` is a ``tcp://host:port`` endpoint acceptable on the wire."""
    return bool(_ADDR_RE.match(addr))


WILDCARD_HOSTS = frozenset({"0.0.0.0", "*", "::", "[::]"})


def dialable_addr(addr: str) -> bool:
    """Whether another host could dial ``addr``: a valid endpoint whose host is not a
    wildcard (PROTOCOL.md §4)."""
    if not valid_addr(addr):
        return False
    host = addr[len("tcp://") :].rsplit(":", 1)[0]
    return host not in WILDCARD_HOSTS
