"""Compressed model updates (``--compress none|fp16|int8|topk:F``), the same at both ends.

A site that compresses sends its update, not its model: the change its training made to the
round's global model, with the error it kept from earlier rounds added (error feedback: what
compression dropped last time is sent when it adds up, so nothing is lost for good, only
late). The coordinator adds the decoded update back to the global model it sent.

Every floating tensor's update is laid end to end in one vector ``v`` (state-dict order), and
the wire carries, in this order:

- ``fp16``: ``v`` as float16 (2 bytes a value);
- ``int8``: ``v`` rounded to int8 on a per-tensor scale (``max |v_t| / 127``), then the
  tensors' scales as one float32 array (1 byte a value, 4 a tensor);
- ``topk:F``: the ``ceil(F x len(v))`` largest-magnitude entries of ``v``: their positions
  (uint32), then their values (float32) (8 bytes an entry sent);

followed by every non-floating tensor (e.g. BatchNorm's ``num_batches_tracked``) as it is:
those are counters, not weights, and are tiny. ``none`` sends the model as before.

``decode`` checks every array's dtype, shape and range against the global model before it
uses one, and says in one line what did not match the run's agreed format.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedweave.errors import UserError

KINDS = ("none", "fp16", "int8", "topk")
INT8_LEVELS = 127


class CompressionMismatch(ValueError):
    """A compressed update not in the run's agreed format (its reason says what differs)."""


@dataclass(frozen=True)
class Compression:
    """A compression of model updates (``parse`` reads ``--compress``).

    Attributes:
        kind: ``none``, ``fp16``, ``int8`` or ``topk``.
        fraction: ``topk``: the share of update values sent, in (0, 1]; 1 otherwise.
    """

    kind: str = "none"
    fraction: float = 1.0

    @classmethod
    def parse(cls, spec: str) -> Compression:
        """``--compress SPEC``; a one-line ``UserError`` naming the accepted forms otherwise."""
        usage = "use none, fp16, int8 or topk:F with F in (0, 1] (e.g. topk:0.1)"
        kind, colon, value = str(spec).strip().partition(":")
        if kind not in KINDS:
            raise UserError(f"--compress {spec!r} is not a compression: {usage}")
        if kind != "topk":
            if colon:
                raise UserError(f"--compress {spec!r}: {kind} takes no value; {usage}")
            return cls(kind)
        try:
            fraction = float(value)
        except ValueError:
            raise UserError(
                f"--compress {spec!r}: the top-k fraction is not a number; {usage}"
            ) from None
        if not (0.0 < fraction <= 1.0) or not math.isfinite(fraction):
            raise UserError(f"--compress {spec!r}: the top-k fraction must be in (0, 1]; {usage}")
        return cls(kind, fraction)

    @property
    def spec(self) -> str:
        return f"topk:{self.fraction:g}" if self.kind == "topk" else self.kind

    @property
    def active(self) -> bool:
        return self.kind != "none"

    def sent_bytes(self, reference: list[np.ndarray]) -> int:
        """Data bytes of what a site sends for a model shaped like ``reference`` (the
        model's own bytes for ``none``), without encoding anything."""
        floating = [np.asarray(r) for r in reference if _is_float(r)]
        exact = sum(int(np.asarray(r).nbytes) for r in reference if not _is_float(r))
        values = sum(int(r.size) for r in floating)
        if self.kind == "fp16":
            return 2 * values + exact
        if self.kind == "int8":
            return values + 4 * len(floating) + exact
        if self.kind == "topk":
            return 8 * top_k_count(self.fraction, values) + exact
        return sum(int(r.nbytes) for r in floating) + exact

    def encode(
        self, local: list[np.ndarray], reference: list[np.ndarray], residual: np.ndarray | None
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """(what the site sends, the error it keeps) for its trained ``local`` model, the
        round's global ``reference`` and the error kept from earlier rounds (``None``: none,
        or one of another model's size)."""
        floating = [i for i, r in enumerate(reference) if _is_float(r)]
        update = _flat([np.asarray(local[i], np.float32) - np.asarray(reference[i], np.float32)
                        for i in floating])  # fmt: skip
        if residual is not None and residual.shape == update.shape:
            update = update + residual
        sizes = [int(np.asarray(reference[i]).size) for i in floating]
        if self.kind == "fp16":
            sent = [update.astype(np.float16)]
        elif self.kind == "int8":
            scales = np.array(
                [np.abs(part).max(initial=0.0) / INT8_LEVELS for part in _split(update, sizes)],
                dtype=np.float32,
            )
            per_value = np.repeat(np.where(scales > 0, scales, 1.0), sizes)
            levels = np.clip(np.rint(update / per_value), -INT8_LEVELS, INT8_LEVELS)
            sent = [levels.astype(np.int8), scales]
        elif self.kind == "topk":
            keep = top_k_count(self.fraction, update.size)
            positions = np.argpartition(np.abs(update), update.size - keep)[update.size - keep :]
            positions = np.sort(positions).astype(np.uint32)
            sent = [positions, update[positions].astype(np.float32)]
        else:
            raise ValueError("compression 'none' sends the model, not an update")
        kept = update - self._expand(sent, sizes, update.size)
        exact = [np.asarray(local[i]) for i, r in enumerate(reference) if not _is_float(r)]
        return sent + exact, kept.astype(np.float32)

    def decode(self, arrays: list[np.ndarray], reference: list[np.ndarray]) -> list[np.ndarray]:
        """The site's model: ``reference`` (the global model the round sent) plus the update
        in ``arrays``; ``CompressionMismatch`` when ``arrays`` are not this compression's
        format for this model."""
        floating = [i for i, r in enumerate(reference) if _is_float(r)]
        sizes = [int(np.asarray(reference[i]).size) for i in floating]
        total = sum(sizes)
        parts = {"fp16": 1, "int8": 2, "topk": 2}[self.kind]
        exact_at = [i for i, r in enumerate(reference) if not _is_float(r)]
        if len(arrays) != parts + len(exact_at):
            raise CompressionMismatch(
                f"{len(arrays)} arrays, but {self.spec} of this model is {parts + len(exact_at)}"
            )
        self._check(arrays[:parts], sizes, total)
        update = self._expand(arrays[:parts], sizes, total)
        out = [np.asarray(r) for r in reference]
        for index, part in zip(floating, _split(update, sizes)):
            ref = np.asarray(reference[index])
            out[index] = (ref.astype(np.float32) + part.reshape(ref.shape)).astype(ref.dtype)
        for index, array in zip(exact_at, arrays[parts:]):
            ref = np.asarray(reference[index])
            if array.dtype != ref.dtype or array.shape != ref.shape:
                raise CompressionMismatch(
                    f"tensor {index} is {array.dtype}{list(array.shape)}, the model's is "
                    f"{ref.dtype}{list(ref.shape)}"
                )
            out[index] = array
        return out

    def _check(self, parts: list[np.ndarray], sizes: list[int], total: int) -> None:
        expected: list[tuple[np.dtype, tuple[int, ...]]]
        if self.kind == "fp16":
            expected = [(np.dtype(np.float16), (total,))]
        elif self.kind == "int8":
            expected = [(np.dtype(np.int8), (total,)), (np.dtype(np.float32), (len(sizes),))]
        else:
            keep = top_k_count(self.fraction, total)
            expected = [(np.dtype(np.uint32), (keep,)), (np.dtype(np.float32), (keep,))]
        for number, (array, (dtype, shape)) in enumerate(zip(parts, expected), 1):
            if array.dtype != dtype or array.shape != shape:
                raise CompressionMismatch(
                    f"array {number} is {array.dtype}{list(array.shape)}, {self.spec} of this "
                    f"model sends {dtype}{list(shape)}"
                )
        if self.kind == "int8" and (np.abs(parts[0].astype(np.int16)) > INT8_LEVELS).any():
            raise CompressionMismatch(f"int8 levels outside ±{INT8_LEVELS}")
        if self.kind == "topk" and parts[0].size:
            positions = parts[0]
            if int(positions.max()) >= total or (np.diff(positions.astype(np.int64)) <= 0).any():
                raise CompressionMismatch("top-k positions out of range or not strictly increasing")

    def _expand(self, sent: list[np.ndarray], sizes: list[int], total: int) -> np.ndarray:
        """The flat update ``sent`` stands for (float32)."""
        if self.kind == "fp16":
            return sent[0].astype(np.float32)
        if self.kind == "int8":
            return sent[0].astype(np.float32) * np.repeat(sent[1], sizes)
        update = np.zeros(total, np.float32)
        update[sent[0].astype(np.int64)] = sent[1]
        return update


def top_k_count(fraction: float, size: int) -> int:
    """How many of ``size`` update values ``topk:fraction`` sends (at least one)."""
    return min(size, max(1, math.ceil(fraction * size))) if size else 0


def _is_float(array: np.ndarray) -> bool:
    return np.issubdtype(np.asarray(array).dtype, np.floating)


def _flat(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros(0, np.float32)
    return np.concatenate([p.reshape(-1) for p in parts]).astype(np.float32, copy=False)


def _split(vector: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    return np.split(vector, np.cumsum(sizes)[:-1]) if sizes else []
