"""The global model sent at half precision (``--downlink fp16``): half the bytes to every site.

The coordinator keeps its model in the task's own precision and aggregates in it; only the
copy it sends a site is rounded to IEEE half precision (float16), tensor by tensor. A tensor
that half precision cannot hold (a value beyond its largest finite number, 65,504) is sent
whole, and so is every tensor that is not floating point (counters, indices). The site
restores each halved tensor to the dtype it had, so its training, its update check, its
compression and SecAgg+'s masking see the model's usual dtypes; what it trains from differs
from the coordinator's model by the rounding alone (a relative 2**-11 at most, for normal
numbers), as when a site trains in mixed precision from a half-precision copy.

What was halved travels with the message as the ``DOWNLINK_KEY`` mark: one entry per tensor,
in order, empty for a tensor sent as it is, else the NumPy dtype code to restore it to
(``f4`` float32, ``f8`` float64). A site reads nothing else: a mark that does not fit the
arrays it came with (another count, an unknown code, a marked tensor that is not float16) is
its one-line refusal (``mark_problem``).

The coordinator's side is ``fedweave/coordinator/rounds/downlink.py`` (a grid that rounds
each model as it leaves), the site's ``fedweave/client/downlink_mod.py`` (a mod that
restores it first); both read and write Flower's legacy records through ``model_records``
and ``legacy_record`` here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

RESTORABLE = {"f4": np.float32, "f8": np.float64}
"""Mark codes → the dtype a halved tensor is restored to."""

_HALF_MAX = float(np.finfo(np.float16).max)


def halved(weights: list[np.ndarray]) -> tuple[list[np.ndarray], str]:
    """``weights`` with every float32/float64 tensor that float16 holds rounded to float16,
    and the mark that says which were (see the module)."""
    sent: list[np.ndarray] = []
    codes: list[str] = []
    for array in weights:
        code = array.dtype.kind + str(array.dtype.itemsize)
        if code not in RESTORABLE or not _fits_half(array):
            sent.append(array)
            codes.append("")
            continue
        sent.append(array.astype(np.float16))
        codes.append(code)
    return sent, ",".join(codes)


def _fits_half(array: np.ndarray) -> bool:
    """Whether every finite value of ``array`` stays finite in float16 (a NaN or inf is sent
    as it is either way: the update checks say what they think of it)."""
    if array.size == 0:
        return True
    finite = array[np.isfinite(array)]
    return finite.size == 0 or float(np.max(np.abs(finite))) <= _HALF_MAX


def mark_problem(mark: object, dtypes: list[np.dtype]) -> str | None:
    """Why ``mark`` cannot describe arrays of ``dtypes`` (as received), or None."""
    if not isinstance(mark, str):
        return f"the half-precision mark is a {type(mark).__name__}, not text"
    codes = mark.split(",")
    if len(codes) != len(dtypes):
        return (
            f"the half-precision mark names {len(codes)} tensors, the message holds "
            f"{len(dtypes)}"
        )
    for index, (code, dtype) in enumerate(zip(codes, dtypes)):
        if code == "":
            continue
        if code not in RESTORABLE:
            return f"the half-precision mark of tensor {index} is {code[:8]!r}, not f4 or f8"
        if dtype != np.float16:
            return f"tensor {index} is marked halved but arrived as {dtype}"
    return None


def restored(weights: list[np.ndarray], mark: str) -> list[np.ndarray]:
    """``weights`` as received with ``mark``, each halved tensor back in its own dtype;
    ``mark`` must have passed ``mark_problem``."""
    return [
        array.astype(RESTORABLE[code]) if code else array
        for array, code in zip(weights, mark.split(","))
    ]



INSTRUCTIONS = ("fitins", "evaluateins")
"""Flower's legacy record prefixes of the instructions that carry a model."""


def model_records(content: Any) -> Iterable[tuple[str, str]]:
    """``(array record name, config record name)`` of each model a message's ``content``
    carries with a config beside it."""
    for prefix in INSTRUCTIONS:
        arrays, config = f"{prefix}.parameters", f"{prefix}.config"
        if arrays in content.array_records and config in content.config_records:
            yield arrays, config


def legacy_record(arrays: list[np.ndarray], like: Any) -> Any:
    """An ``ArrayRecord`` of ``arrays`` under the keys of ``like`` (an ``ArrayRecord``), in
    Flower's legacy layout: each array's NumPy serialisation, as ``fitins_to_recorddict``
    writes it."""
    from flwr.app import Array, ArrayRecord
    from flwr.common import ndarray_to_bytes

    return ArrayRecord(
        array_dict={
            key: Array(dtype=old.dtype, shape=old.shape, stype=old.stype,
                       data=ndarray_to_bytes(array))
            for (key, old), array in zip(like.items(), arrays)
        },
    )  # fmt: skip
